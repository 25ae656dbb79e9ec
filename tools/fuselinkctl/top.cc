// fuselinkctl top: a live terminal view of one node — each NIC's own and borrowed
// rates, owner busy, borrowed chunks in flight, failed writes; relay memory; the
// node's transfers — redrawn every --interval_ms from the agent's topology (gRPC) and
// its /metrics (HTTP). Rates are differences between two scrapes.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "clients/cpp/scrape.h"
#include "tools/fuselinkctl/commands.h"

ABSL_FLAG(std::string, metrics, "",
          "top: the agent's metrics, host:port or an http:// URL (default: the --agent "
          "host, port 17351, the Helm chart's).");
ABSL_FLAG(int, interval_ms, 1000, "top: time between two frames.");
ABSL_FLAG(int, frames, 0, "top: frames to draw, then exit; 0: until interrupted.");

namespace fuselink::ctl {
namespace {

constexpr int kDefaultMetricsPort = 17351;
constexpr absl::Duration kScrapeTimeout = absl::Seconds(2);

// One scrape, reduced to what the view shows. Counters are cumulative.
struct NicSample {
  double tx_own = 0, tx_borrowed = 0, rx_own = 0, rx_borrowed = 0;  // bytes
  double owner_busy = 0, receive_owner_busy = 0, borrowed_in_flight = 0;
  double failed_writes = 0;
  // Foreign bytes both ways; -1: the agent does not watch this NIC (or is older).
  double foreign = -1;
};
struct Sample {
  absl::Time at;
  std::vector<NicSample> nics;                                      // topology order
  std::map<std::string, double> relay_gpu_bytes, relay_gpu_paused;  // by gpu label
  double relay_cap_bytes = -1;                                      // -1: no GPU relay
  double active_out = 0, active_in = 0, tensors = 0;
  std::map<std::string, double> outcomes;  // transfers_total by outcome
};

double Value(const std::string& body, const std::string& name,
             const std::map<std::string, std::string>& labels = {}) {
  absl::StatusOr<double> v = client::MetricValue(body, name, labels);
  return v.ok() ? *v : 0;
}

Sample Reduce(const std::string& body, const v1::Topology& topology, absl::Time at) {
  Sample s;
  s.at = at;
  for (const v1::Nic& nic : topology.nics()) {
    const std::string& n = nic.name();
    NicSample x;
    x.tx_own = Value(body, "fuselink_nic_transmitted_bytes_total",
                     {{"nic", n}, {"traffic", "own"}});
    x.tx_borrowed = Value(body, "fuselink_nic_transmitted_bytes_total",
                          {{"nic", n}, {"traffic", "borrowed"}});
    x.rx_own = Value(body, "fuselink_nic_received_bytes_total",
                     {{"nic", n}, {"traffic", "own"}});
    x.rx_borrowed = Value(body, "fuselink_nic_received_bytes_total",
                          {{"nic", n}, {"traffic", "borrowed"}});
    x.owner_busy = Value(body, "fuselink_nic_owner_busy", {{"nic", n}});
    x.receive_owner_busy = Value(body, "fuselink_nic_receive_owner_busy", {{"nic", n}});
    x.borrowed_in_flight =
        Value(body, "fuselink_nic_borrowed_chunks_in_flight", {{"nic", n}});
    x.failed_writes = Value(body, "fuselink_nic_failed_writes_total", {{"nic", n}});
    absl::StatusOr<double> foreign_tx = client::MetricValue(
        body, "fuselink_nic_foreign_bytes_total", {{"nic", n}, {"direction", "tx"}});
    absl::StatusOr<double> foreign_rx = client::MetricValue(
        body, "fuselink_nic_foreign_bytes_total", {{"nic", n}, {"direction", "rx"}});
    if (foreign_tx.ok() && foreign_rx.ok()) x.foreign = *foreign_tx + *foreign_rx;
    s.nics.push_back(x);
  }
  if (absl::StatusOr<double> cap =
          client::MetricValue(body, "fuselink_relay_device_cap_bytes");
      cap.ok()) {
    s.relay_cap_bytes = *cap;
    for (int g = 0; g < topology.gpus_size(); ++g) {
      const std::string gpu = absl::StrCat(g);
      s.relay_gpu_bytes[gpu] = Value(body, "fuselink_relay_device_bytes", {{"gpu", gpu}});
      s.relay_gpu_paused[gpu] = Value(body, "fuselink_relay_paused", {{"gpu", gpu}});
    }
  }
  s.active_out = Value(body, "fuselink_transfers_active");
  s.active_in = Value(body, "fuselink_incoming_transfers_active");
  s.tensors = Value(body, "fuselink_tensors_registered");
  for (const char* o : {"completed", "failed", "cancelled"}) {
    s.outcomes[o] = Value(body, "fuselink_transfers_total", {{"outcome", o}});
  }
  return s;
}

std::string Bits(double bytes_per_s) {
  const double b = bytes_per_s * 8;
  if (b >= 1e9) return absl::StrFormat("%.2f Gbit/s", b / 1e9);
  if (b >= 1e6) return absl::StrFormat("%.1f Mbit/s", b / 1e6);
  if (b >= 1e3) return absl::StrFormat("%.1f kbit/s", b / 1e3);
  return absl::StrFormat("%.0f bit/s", b);
}

std::string MiB(double bytes) { return absl::StrFormat("%.1f MiB", bytes / (1 << 20)); }

// A frame: the difference between `prev` and `cur`, as text (no escape codes).
std::string Render(const v1::Topology& t, const Sample& prev, const Sample& cur) {
  const double dt = absl::ToDoubleSeconds(cur.at - prev.at);
  auto rate = [&](double a, double b) { return dt > 0 && b >= a ? (b - a) / dt : 0.0; };
  std::string out = absl::StrFormat(
      "fuselink top  node %s  transport %s  %d NICs  %d GPUs  every %.1f s  %s\n\n",
      t.node(), t.transport(), t.nics_size(), t.gpus_size(),
      absl::GetFlag(FLAGS_interval_ms) / 1000.0,
      absl::FormatTime("%H:%M:%S", cur.at, absl::LocalTimeZone()));
  bool any_foreign = false;
  for (const NicSample& x : cur.nics) any_foreign = any_foreign || x.foreign >= 0;
  absl::StrAppendFormat(&out, "%-8s %-4s %13s %13s %13s %13s %5s %5s %9s %7s%s\n", "NIC",
                        "GPU", "TX OWN", "TX BORROWED", "RX OWN", "RX BORROWED", "UTIL",
                        "BUSY", "BORROWED", "FAILED",
                        any_foreign ? absl::StrFormat(" %13s", "FOREIGN") : "");
  for (int k = 0; k < t.nics_size() && k < static_cast<int>(cur.nics.size()); ++k) {
    const NicSample &a = prev.nics[k], &b = cur.nics[k];
    const v1::Nic& nic = t.nics(k);
    const double tx = rate(a.tx_own, b.tx_own) + rate(a.tx_borrowed, b.tx_borrowed);
    const double rx = rate(a.rx_own, b.rx_own) + rate(a.rx_borrowed, b.rx_borrowed);
    const std::string util =
        nic.rate_bytes_per_s() > 0
            ? absl::StrFormat("%.0f%%", 100 * std::max(tx, rx) / nic.rate_bytes_per_s())
            : "-";
    const char* busy = b.owner_busy > 0 ? (b.receive_owner_busy > 0 ? "tx+rx" : "tx")
                                        : (b.receive_owner_busy > 0 ? "rx" : "-");
    // Foreign traffic, both ways: "-" where the agent does not watch the NIC.
    std::string foreign;
    if (any_foreign) {
      foreign = absl::StrFormat(" %13s", b.foreign >= 0 && a.foreign >= 0
                                             ? Bits(rate(a.foreign, b.foreign))
                                             : "-");
    }
    absl::StrAppendFormat(&out, "%-8s %-4u %13s %13s %13s %13s %5s %5s %9.0f %7.0f%s\n",
                          nic.name(), nic.owner_gpu(), Bits(rate(a.tx_own, b.tx_own)),
                          Bits(rate(a.tx_borrowed, b.tx_borrowed)),
                          Bits(rate(a.rx_own, b.rx_own)),
                          Bits(rate(a.rx_borrowed, b.rx_borrowed)), util, busy,
                          b.borrowed_in_flight, b.failed_writes, foreign);
  }
  out += "\nrelay  ";
  if (cur.relay_cap_bytes >= 0) {
    for (const auto& [gpu, bytes] : cur.relay_gpu_bytes) {
      absl::StrAppendFormat(&out, "  gpu%s %s of %s%s", gpu, MiB(bytes),
                            MiB(cur.relay_cap_bytes),
                            cur.relay_gpu_paused.at(gpu) > 0 ? " PAUSED" : "");
    }
  } else {
    out += "  (no GPU relay)";
  }
  absl::StrAppendFormat(&out, "\ntransfers  active %.0f out, %.0f in   tensors %.0f\n",
                        cur.active_out, cur.active_in, cur.tensors);
  for (const auto& [outcome, n] : cur.outcomes) {
    absl::StrAppendFormat(&out, "  %-9s %6.0f  (%+.1f/s)\n", outcome, n,
                          rate(prev.outcomes.at(outcome), n));
  }
  return out;
}

std::string MetricsUrl(const std::string& agent_address) {
  std::string m = absl::GetFlag(FLAGS_metrics);
  if (m.empty()) {
    m = absl::StrCat(agent_address.substr(0, agent_address.rfind(':')), ":",
                     kDefaultMetricsPort);
  }
  if (!absl::StartsWith(m, "http://")) m = absl::StrCat("http://", m);
  if (m.find('/', 7) == std::string::npos) m += "/metrics";
  return m;
}

volatile std::sig_atomic_t stop_requested = 0;

}  // namespace

int Top(Context& ctx) {
  v1::Topology topology;
  grpc::ClientContext call;
  call.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (grpc::Status s = ctx.agent->GetTopology(&call, v1::GetTopologyRequest(), &topology);
      !s.ok()) {
    std::fprintf(stderr, "fuselinkctl top: GetTopology: %s\n", s.error_message().c_str());
    return 1;
  }
  const std::string url = MetricsUrl(ctx.agent_address);
  const int frames = absl::GetFlag(FLAGS_frames);
  const absl::Duration interval =
      absl::Milliseconds(std::max(100, absl::GetFlag(FLAGS_interval_ms)));
  std::signal(SIGINT, [](int) { stop_requested = 1; });
  std::signal(SIGTERM, [](int) { stop_requested = 1; });
  const bool tty = isatty(STDOUT_FILENO);
  Sample prev;
  bool have_prev = false;
  for (int frame = 0; !stop_requested && (frames == 0 || frame < frames);) {
    absl::StatusOr<std::string> body = client::HttpGet(url, kScrapeTimeout);
    const absl::Time now = absl::Now();
    if (!body.ok()) {
      std::fprintf(stderr, "fuselinkctl top: %s\n", body.status().ToString().c_str());
      return 1;
    }
    Sample cur = Reduce(*body, topology, now);
    if (have_prev) {
      // Home and clear on a terminal; frames one after another otherwise.
      std::printf("%s%s", tty ? "\x1b[H\x1b[2J" : "\n",
                  Render(topology, prev, cur).c_str());
      std::fflush(stdout);
      ++frame;
    }
    prev = std::move(cur);
    have_prev = true;
    absl::SleepFor(interval - (absl::Now() - now));
  }
  return 0;
}

}  // namespace fuselink::ctl
