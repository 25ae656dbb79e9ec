// The workloads of many GPUs at once: disaggregated serving (Poisson arrivals,
// long-tailed prompts), an expert-parallel all-to-all with a Zipf expert load, and
// DLRM-like embedding all-to-alls with unequal workers. Every random draw comes from
// a generator seeded by --seed, so every policy sees the same traffic.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "tools/bench/sched_workloads.h"

namespace fuselink::bench {
namespace {

// Keeps the first error of many threads.
class FirstError {
 public:
  void Note(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = s;
  }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Free request slots of a decode instance: Take waits for one.
class SlotPool {
 public:
  explicit SlotPool(uint32_t slots) {
    for (uint32_t s = slots; s > 0; --s) free_.push_back(s - 1);
  }
  uint32_t Take() {
    absl::MutexLock lock(
        &mu_, absl::Condition(
                  +[](std::vector<uint32_t>* f) { return !f->empty(); }, &free_));
    const uint32_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  void Give(uint32_t slot) {
    absl::MutexLock lock(&mu_);
    free_.push_back(slot);
  }

 private:
  absl::Mutex mu_;
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
};

// One transfer of an all-to-all: blocks of a sender's tensor into a receiver's.
struct Flow {
  int sender = 0, receiver = 0;  // global GPU index: node * nics + gpu
  uint32_t source_begin = 0, target_begin = 0, blocks = 0;
};

// An all-to-all among the GPUs of every node, each GPU sending to every GPU of the
// other nodes (pairs within a node move over NVLink, not measured here): `mib[g]`
// MiB from GPU g, split evenly over its receivers. Runs `iterations` times; returns
// per iteration the time of each sender (its last flow done).
class AllToAll {
 public:
  static absl::StatusOr<std::unique_ptr<AllToAll>> Create(
      Cluster& c, int nics, const std::vector<uint32_t>& mib) {
    std::unique_ptr<AllToAll> a(new AllToAll(c, nics));
    const int nodes = static_cast<int>(c.nodes.size());
    const int gpus = nodes * nics;
    const int receivers = (nodes - 1) * nics;
    std::vector<uint32_t> incoming(gpus, 0);
    std::vector<uint32_t> outgoing(gpus, 0);
    for (int s = 0; s < gpus; ++s) {
      const uint32_t each = std::max<uint32_t>(1, mib[s] / receivers);
      for (int receiver = 0; receiver < gpus; ++receiver) {
        if (receiver / nics == s / nics) continue;
        a->flows_.push_back(Flow{s, receiver, outgoing[s], incoming[receiver], each});
        outgoing[s] += each;
        incoming[receiver] += each;
      }
    }
    for (int g = 0; g < gpus; ++g) {
      NodeAgent& agent = c.nodes[g / nics];
      const uint32_t home = g % nics;
      FL_ASSIGN_OR_RETURN(auto s, HomedTensor::Create(agent, NextRequestId("a2a-out"), 1,
                                                      outgoing[g], kMiB, home, true));
      FL_ASSIGN_OR_RETURN(auto t, HomedTensor::Create(agent, NextRequestId("a2a-in"), 1,
                                                      incoming[g], kMiB, home, false));
      a->out_.push_back(std::move(s));
      a->in_.push_back(std::move(t));
    }
    return a;
  }

  // Starts every flow at once; the seconds each sender took, and the whole.
  absl::StatusOr<std::vector<double>> Run() {
    FirstError error;
    std::vector<double> sender_s(out_.size(), 0);
    absl::Mutex mu;
    const absl::Time start = absl::Now();
    std::vector<std::thread> threads;
    for (const Flow& f : flows_) {
      threads.emplace_back([&, f] {
        NodeAgent& agent = cluster_.nodes[f.sender / nics_];
        absl::StatusOr<TransferTimes> t = RunToEnd(
            agent, BlockRequest(NextRequestId("a2a"), *out_[f.sender], f.source_begin,
                                *in_[f.receiver], f.target_begin, f.blocks));
        if (!t.ok()) return error.Note(t.status());
        absl::MutexLock lock(&mu);
        sender_s[f.sender] =
            std::max(sender_s[f.sender], absl::ToDoubleSeconds(t->completed - start));
      });
    }
    for (std::thread& t : threads) t.join();
    FL_RETURN_IF_ERROR(error.status());
    for (const Flow& f : flows_) {
      if (!BlocksMatch(*out_[f.sender], f.source_begin, *in_[f.receiver], f.target_begin,
                       f.blocks)) {
        return absl::DataLossError("all-to-all: a receiver's bytes differ");
      }
    }
    return sender_s;
  }

  uint64_t total_mib() const {
    uint64_t sum = 0;
    for (const Flow& f : flows_) sum += f.blocks;
    return sum;
  }

 private:
  AllToAll(Cluster& c, int nics) : cluster_(c), nics_(nics) {}
  Cluster& cluster_;
  const int nics_;
  std::vector<Flow> flows_;
  std::vector<std::unique_ptr<HomedTensor>> out_, in_;
};

std::string Loads(const std::vector<uint32_t>& mib) {
  std::string out;
  for (size_t g = 0; g < mib.size(); ++g) absl::StrAppend(&out, g ? "/" : "", mib[g]);
  return out;
}

}  // namespace

absl::StatusOr<PolicyRow> ServingWorkload(Cluster& c, const SchedOptions& o,
                                          Sampler& sampler, RunContext&) {
  // A KV cache block holds 16 tokens of 4 layer groups; an instance has `kSlots`
  // request slots, each as large as the longest prompt. A request that finds every
  // slot busy waits: its completion time counts from its arrival. Prefill instance i
  // is GPU i % nics of prefill node i / nics; its requests go to the same GPU of a
  // decode node drawn for each, which has `kSlots` slots too: with more than one
  // prefill node a request may also wait for one of those (with two nodes it never
  // does: each decode GPU has one prefill instance).
  constexpr uint32_t kTokensPerBlock = 16, kLayers = 4, kSlots = 4;
  const uint64_t block_bytes = o.kv_bytes_per_token * kTokensPerBlock / kLayers;
  const uint32_t slot_blocks = (o.max_tokens + kTokensPerBlock - 1) / kTokensPerBlock;
  const int half = o.nodes / 2;
  const int instances = half * o.nics;
  struct Arrival {
    double at_s;
    uint32_t blocks;
    int decode_node;
  };
  std::vector<std::vector<Arrival>> arrivals(instances);
  for (int i = 0; i < instances; ++i) {
    std::mt19937_64 rng(o.seed * 1000 + i);
    std::exponential_distribution<double> gap(o.serving_arrivals_per_s);
    std::lognormal_distribution<double> tokens(std::log(o.prompt_tokens_median),
                                               o.prompt_tokens_sigma);
    std::mt19937_64 route(o.seed * 1000 + 500 + i);
    std::uniform_int_distribution<int> decode_node(half, o.nodes - 1);
    for (double t = gap(rng); t < o.serving_seconds; t += gap(rng)) {
      const double n = std::clamp(tokens(rng), 1.0, static_cast<double>(o.max_tokens));
      arrivals[i].push_back(
          {t, static_cast<uint32_t>(std::ceil(n / kTokensPerBlock)), decode_node(route)});
    }
  }
  // prefill[i]: instance i's slots; decode[(node - half) * nics + gpu]: that decode
  // GPU's, handed out by decode_slots[the same index].
  std::vector<std::unique_ptr<HomedTensor>> prefill, decode;
  std::vector<std::unique_ptr<SlotPool>> decode_slots;
  for (int i = 0; i < instances; ++i) {
    FL_ASSIGN_OR_RETURN(
        auto s,
        HomedTensor::Create(c.nodes[i / o.nics], NextRequestId("prefill"), kLayers,
                            kSlots * slot_blocks, block_bytes, i % o.nics, true));
    prefill.push_back(std::move(s));
  }
  for (int i = 0; i < instances; ++i) {
    FL_ASSIGN_OR_RETURN(
        auto t,
        HomedTensor::Create(c.nodes[half + i / o.nics], NextRequestId("decode"), kLayers,
                            kSlots * slot_blocks, block_bytes, i % o.nics, false));
    decode.push_back(std::move(t));
    decode_slots.push_back(std::make_unique<SlotPool>(kSlots));
  }
  FirstError error;
  absl::Mutex mu;
  std::vector<size_t> next(instances, 0);
  std::vector<double> completion_s;
  uint64_t bytes = 0;
  sampler.Start();
  const absl::Time start = absl::Now();
  std::vector<std::thread> workers;
  for (int i = 0; i < instances; ++i) {
    for (uint32_t slot = 0; slot < kSlots; ++slot) {
      workers.emplace_back([&, i, slot] {
        for (;;) {
          size_t n;
          {
            absl::MutexLock lock(&mu);
            n = next[i]++;
          }
          if (n >= arrivals[i].size()) return;
          const Arrival& a = arrivals[i][n];
          const absl::Time arrived = start + absl::Seconds(a.at_s);
          absl::SleepFor(arrived - absl::Now());
          const uint32_t begin = slot * slot_blocks;
          const int into = (a.decode_node - half) * o.nics + i % o.nics;
          HomedTensor& target = *decode[into];
          const uint32_t target_slot = decode_slots[into]->Take();
          const uint32_t target_begin = target_slot * slot_blocks;
          absl::StatusOr<TransferTimes> t = RunToEnd(
              c.nodes[i / o.nics], BlockRequest(NextRequestId("kv"), *prefill[i], begin,
                                                target, target_begin, a.blocks));
          const bool match =
              t.ok() && BlocksMatch(*prefill[i], begin, target, target_begin, a.blocks);
          decode_slots[into]->Give(target_slot);
          if (!t.ok()) return error.Note(t.status());
          if (!match) {
            return error.Note(
                absl::DataLossError("serving: a decode instance's bytes differ"));
          }
          absl::MutexLock lock(&mu);
          completion_s.push_back(absl::ToDoubleSeconds(t->completed - arrived));
          bytes += uint64_t{a.blocks} * block_bytes * kLayers;
        }
      });
    }
  }
  for (std::thread& w : workers) w.join();
  sampler.Stop();
  FL_RETURN_IF_ERROR(error.status());
  const Summary s = Summarize(completion_s);
  const double mean = std::accumulate(completion_s.begin(), completion_s.end(), 0.0) /
                      std::max<size_t>(1, completion_s.size());
  // The load each NIC would carry with its own traffic only: bytes over the run's
  // length and the NICs' total rate.
  const double load =
      static_cast<double>(bytes) / o.serving_seconds / (o.rail_bytes_per_s * instances);
  std::vector<double> sorted = completion_s;
  PolicyRow row{Result("sched_serving"), s.median, false};
  row.result.Add("policy", c.policy)
      .Add("requests", static_cast<int64_t>(s.count))
      .Add("mean_mib", static_cast<double>(bytes) / kMiB / std::max<size_t>(1, s.count))
      .Add("nic_load_pct", 100 * load)
      .Add("p50_ms", 1e3 * s.median)
      .Add("p90_ms", 1e3 * Percentile(sorted, 0.9))
      .Add("p99_ms", 1e3 * s.p99)
      .Add("mean_ms", 1e3 * mean)
      .Add("verified", std::string("yes"));
  return row;
}

absl::StatusOr<PolicyRow> ExpertWorkload(Cluster& c, const SchedOptions& o,
                                         Sampler& sampler, RunContext&) {
  // Expert e lives on GPU e; its popularity is Zipf over a seeded rank order. In the
  // combine all-to-all each expert returns its tokens' outputs, so a popular
  // expert's GPU sends the most.
  const int gpus = o.nodes * o.nics;
  std::vector<int> rank(gpus);
  std::iota(rank.begin(), rank.end(), 1);
  std::shuffle(rank.begin(), rank.end(), std::mt19937(o.seed));
  double norm = 0;
  for (int r = 1; r <= gpus; ++r) norm += std::pow(r, -o.expert_zipf_s);
  std::vector<uint32_t> mib(gpus);
  for (int g = 0; g < gpus; ++g) {
    mib[g] = static_cast<uint32_t>(static_cast<double>(o.expert_bytes) / kMiB *
                                   std::pow(rank[g], -o.expert_zipf_s) / norm);
  }
  FL_ASSIGN_OR_RETURN(auto a2a, AllToAll::Create(c, o.nics, mib));
  sampler.Start();
  FL_ASSIGN_OR_RETURN(std::vector<double> sender_s, a2a->Run());
  sampler.Stop();
  const double all = *std::max_element(sender_s.begin(), sender_s.end());
  PolicyRow row{Result("sched_expert"), all, false};
  row.result.Add("policy", c.policy)
      .Add("mib", static_cast<int64_t>(a2a->total_mib()))
      .Add("mib_per_gpu", Loads(mib))
      .Add("seconds", all)
      .Add("node_a_s", *std::max_element(sender_s.begin(), sender_s.begin() + o.nics))
      .Add("node_b_s",
           *std::max_element(sender_s.begin() + o.nics, sender_s.begin() + 2 * o.nics))
      .Add("verified", std::string("yes"));
  return row;
}

absl::StatusOr<PolicyRow> DlrmWorkload(Cluster& c, const SchedOptions& o,
                                       Sampler& sampler, RunContext&) {
  // Worker w's embedding tables are looked up `load[w]` times the mean (lognormal,
  // seeded, mean 1): it sends that much of each iteration's all-to-all.
  const int gpus = o.nodes * o.nics;
  std::mt19937_64 rng(o.seed + 77);
  std::lognormal_distribution<double> draw(0, o.dlrm_sigma);
  std::vector<double> load(gpus);
  for (double& l : load) l = draw(rng);
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / gpus;
  std::vector<uint32_t> mib(gpus);
  for (int g = 0; g < gpus; ++g) {
    mib[g] =
        static_cast<uint32_t>(load[g] / mean * static_cast<double>(o.dlrm_bytes) / kMiB);
  }
  FL_ASSIGN_OR_RETURN(auto a2a, AllToAll::Create(c, o.nics, mib));
  std::vector<double> slowest;
  sampler.Start();
  for (int i = 0; i < o.dlrm_iterations; ++i) {
    FL_ASSIGN_OR_RETURN(std::vector<double> worker_s, a2a->Run());
    slowest.push_back(*std::max_element(worker_s.begin(), worker_s.end()));
  }
  sampler.Stop();
  const double mean_slowest = std::accumulate(slowest.begin(), slowest.end(), 0.0) /
                              std::max<size_t>(1, slowest.size());
  PolicyRow row{Result("sched_dlrm"), mean_slowest, false};
  row.result.Add("policy", c.policy)
      .Add("iterations", static_cast<int64_t>(slowest.size()))
      .Add("mib_per_worker", Loads(mib))
      .Add("slowest_worker_s", mean_slowest)
      .Add("slowest_max_s", *std::max_element(slowest.begin(), slowest.end()))
      .Add("verified", std::string("yes"));
  return row;
}

}  // namespace fuselink::bench
