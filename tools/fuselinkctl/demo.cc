// fuselinkctl demo: what fuselink is for, on two agents. A hot GPU (0) moves a KV
// cache to the other node over its own NIC and, under the fuselink policy, its idle
// neighbours' NICs too; once it is under way, GPU 1 (the owner of rail1) starts a
// transfer of its own, and the hot transfer gives rail1 back. The demo prints how many
// bytes the hot transfer still sent on rail1 while its owner's ran, and verifies every
// byte in the target's memory.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "clients/cpp/client.h"
#include "clients/cpp/dial.h"
#include "grpcpp/grpcpp.h"
#include "tools/fuselinkctl/commands.h"

ABSL_FLAG(std::string, target_agent, "127.0.0.1:50052", "demo: the target node's agent.");
ABSL_FLAG(std::string, source_socket, "/run/fuselink/node-a.sock",
          "demo: source handle socket.");
ABSL_FLAG(std::string, target_socket, "/run/fuselink/node-b.sock",
          "demo: target handle socket.");
ABSL_FLAG(uint32_t, demo_layers, 32, "demo: layers of the KV cache.");
ABSL_FLAG(uint32_t, demo_blocks, 64, "demo: blocks per layer.");
ABSL_FLAG(uint64_t, demo_block_bytes, 256 << 10, "demo: bytes per block.");
ABSL_FLAG(uint32_t, demo_owner_blocks, 0,
          "demo: blocks per layer GPU 1 moves over its own NIC once the hot transfer "
          "reports its first progress; 0: no owner.");
ABSL_DECLARE_FLAG(int, timeout_s);

namespace fuselink::ctl {
namespace {

// A KV cache lent on both nodes by their engines: random bytes on the source, zeros
// on the target.
struct DemoPair {
  std::string name;
  v1::Layout layout;
  std::unique_ptr<client::HostBuffer> source, target;
  uint64_t bytes() const { return source->span().size(); }
  bool Same() const { return std::memcmp(source->data(), target->data(), bytes()) == 0; }
};

absl::StatusOr<DemoPair> MakePair(const std::string& prefix, uint32_t blocks,
                                  uint32_t home_gpu, v1::Agent::Stub& source_engine,
                                  v1::Agent::Stub& target_engine) {
  DemoPair pair;
  pair.layout.set_layers(absl::GetFlag(FLAGS_demo_layers));
  pair.layout.set_blocks_per_layer(blocks);
  pair.layout.set_block_bytes(absl::GetFlag(FLAGS_demo_block_bytes));
  const uint64_t bytes =
      uint64_t{pair.layout.layers()} * blocks * pair.layout.block_bytes();
  const uint64_t seed = std::random_device{}();
  pair.name = absl::StrFormat("%s-%08x", prefix, static_cast<uint32_t>(seed));
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> source =
      client::HostBuffer::Create("fuselink-demo-source", bytes);
  if (!source.ok()) return source.status();
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> target =
      client::HostBuffer::Create("fuselink-demo-target", bytes);
  if (!target.ok()) return target.status();
  pair.source = *std::move(source);
  pair.target = *std::move(target);
  client::FillPattern(pair.source->span(), seed);
  std::memset(pair.target->data(), 0, bytes);
  for (auto [engine, socket, buffer] :
       {std::tuple{&source_engine, absl::GetFlag(FLAGS_source_socket), pair.source.get()},
        std::tuple{&target_engine, absl::GetFlag(FLAGS_target_socket),
                   pair.target.get()}}) {
    absl::StatusOr<v1::Tensor> registered = client::RegisterHostTensor(
        *engine, socket, pair.name, pair.layout, *buffer, home_gpu);
    if (!registered.ok()) return registered.status();
  }
  return pair;
}

v1::TransferRequest Whole(const DemoPair& pair, const std::string& source_node,
                          const std::string& target_node) {
  v1::TransferRequest request;
  request.set_request_id(absl::StrCat("demo-", pair.name));
  request.mutable_source()->set_node(source_node);
  request.mutable_source()->set_tensor(pair.name);
  request.mutable_target()->set_node(target_node);
  request.mutable_target()->set_tensor(pair.name);
  for (uint32_t b = 0; b < pair.layout.blocks_per_layer(); ++b) {
    request.mutable_source()->add_block_ids(b);
    request.mutable_target()->add_block_ids(b);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  request.mutable_deadline()->set_seconds(absl::ToUnixSeconds(deadline));
  return request;
}

uint64_t BytesOn(const google::protobuf::RepeatedPtrField<v1::NicBytes>& per_nic,
                 const std::string& nic) {
  for (const v1::NicBytes& n : per_nic) {
    if (n.nic() == nic) return n.bytes();
  }
  return 0;
}

bool Verify(const DemoPair& pair, const std::string& what, const std::string& source,
            const std::string& target) {
  const bool same = pair.Same();
  std::printf("verify %s: %s's bytes %s %s's (%s compared in %s's memory)\n",
              what.c_str(), target.c_str(), same ? "match" : "DIFFER FROM",
              source.c_str(), Bytes(pair.bytes()).c_str(), target.c_str());
  return same;
}

}  // namespace

// Plays both parts a deployment splits: the engines on both nodes register the KV
// caches (as Speaker::kEngine, which owns them), the router moves them (as the
// caller, whom the default grants "role:router" let read and write them).
int Demo(Context& ctx) {
  const std::string target_address = absl::GetFlag(FLAGS_target_agent);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channels[] = {
      client::DialAgent(target_address),
      client::DialAgent(ctx.agent_address, client::Speaker::kEngine),
      client::DialAgent(target_address, client::Speaker::kEngine)};
  for (const auto& channel : channels) {
    if (!channel.ok()) return FailedStatus(channel.status());
  }
  auto target_agent = v1::Agent::NewStub(*channels[0]);
  auto source_engine = v1::Agent::NewStub(*channels[1]);
  auto target_engine = v1::Agent::NewStub(*channels[2]);
  v1::Topology src_topo, dst_topo;
  grpc::Status s = Call([&](grpc::ClientContext* c) {
    return ctx.agent->GetTopology(c, v1::GetTopologyRequest(), &src_topo);
  });
  if (!s.ok()) return Failed(s);
  s = Call([&](grpc::ClientContext* c) {
    return target_agent->GetTopology(c, v1::GetTopologyRequest(), &dst_topo);
  });
  if (!s.ok()) return Failed(s);
  const std::string& from = src_topo.node();
  const std::string& to = dst_topo.node();

  absl::StatusOr<DemoPair> hot = MakePair("demo-kv", absl::GetFlag(FLAGS_demo_blocks), 0,
                                          *source_engine, *target_engine);
  if (!hot.ok()) return FailedStatus(hot.status());
  std::printf("KV cache '%s' of GPU 0: %u layers x %u blocks x %s = %s on %s and on %s\n",
              hot->name.c_str(), hot->layout.layers(), hot->layout.blocks_per_layer(),
              Bytes(hot->layout.block_bytes()).c_str(), Bytes(hot->bytes()).c_str(),
              from.c_str(), to.c_str());
  std::vector<DemoPair*> lent = {&*hot};

  // The owner: GPU 1's KV cache, moved over rail1, the NIC GPU 1 owns.
  const uint32_t owner_blocks = absl::GetFlag(FLAGS_demo_owner_blocks);
  const bool with_owner = owner_blocks > 0 && src_topo.nics_size() > 1;
  const std::string owner_nic = with_owner ? src_topo.nics(1).name() : "";
  absl::StatusOr<DemoPair> owner = absl::UnknownError("no owner");
  if (with_owner) {
    owner = MakePair("demo-owner", owner_blocks, 1, *source_engine, *target_engine);
    if (!owner.ok()) return FailedStatus(owner.status());
    lent.push_back(&*owner);
  }
  // What the hot transfer had sent on the owner's NIC when the owner's transfer was
  // accepted and when it completed, and whether it had ended by then.
  std::atomic<uint64_t> hot_on_owner_nic{0};
  std::atomic<bool> hot_ended{false};
  uint64_t at_owner_start = 0, at_owner_end = 0;
  bool hot_ended_first = false;
  client::TransferOutcome owner_outcome;
  absl::Notification owner_go;
  std::thread owner_thread;
  if (with_owner) {
    owner_thread = std::thread([&] {
      owner_go.WaitForNotification();
      owner_outcome = client::RunTransfer(
          *ctx.agent, Whole(*owner, from, to),
          [&](const v1::TransferEvent& e) {
            if (e.has_accepted()) {
              at_owner_start = hot_on_owner_nic.load();
              hot_ended_first = hot_ended.load();
            }
            if (e.has_completed()) at_owner_end = hot_on_owner_nic.load();
          },
          absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
    });
  }
  // The owner starts at the hot transfer's first progress, not later: progress is
  // reported every 50 ms, and a hot transfer of a few hundred MiB on loopback ends
  // within two or three reports.
  int rc = Follow(ctx, Whole(*hot, from, to), [&](const v1::TransferEvent& e) {
    if (e.has_completed() || e.has_failed()) hot_ended.store(true);
    if (!e.has_progress()) return;
    hot_on_owner_nic.store(BytesOn(e.progress().per_nic(), owner_nic));
    if (with_owner && !owner_go.HasBeenNotified()) owner_go.Notify();
  });
  if (with_owner) {
    if (!owner_go.HasBeenNotified()) owner_go.Notify();  // the hot one ended first
    owner_thread.join();
  }
  if (rc == 0) rc = Verify(*hot, "GPU 0's", from, to) ? 0 : 1;
  if (with_owner) {
    if (!owner_outcome.status.ok()) {
      rc = FailedStatus(owner_outcome.status);
    } else {
      const v1::Completed& done = owner_outcome.last.completed();
      std::printf(
          "GPU 1, the owner of %s, moved %s in %.3f s (%s of it on %s); meanwhile the "
          "hot transfer sent %s more on %s (%s before)\n",
          owner_nic.c_str(), Bytes(done.total_bytes()).c_str(), done.seconds(),
          Bytes(BytesOn(done.per_nic(), owner_nic)).c_str(), owner_nic.c_str(),
          Bytes(at_owner_end - at_owner_start).c_str(), owner_nic.c_str(),
          Bytes(at_owner_start).c_str());
      if (hot_ended_first) {
        std::printf(
            "the hot transfer had ended before GPU 1's began: nothing to give back\n");
      }
      if (!Verify(*owner, "GPU 1's", from, to)) rc = 1;
    }
  }
  for (DemoPair* pair : lent) {
    for (auto* agent : {source_engine.get(), target_engine.get()}) {
      if (absl::Status s = client::UnregisterTensor(*agent, pair->name); !s.ok()) {
        std::fprintf(stderr, "warning: unregister %s: %s\n", pair->name.c_str(),
                     s.ToString().c_str());
      }
    }
  }
  return rc;
}

}  // namespace fuselink::ctl
