#include "tools/bench/sched_timeline.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "clients/cpp/scrape.h"

namespace fuselink::bench {

Sampler::Sampler(const Cluster& cluster, std::vector<int> nodes, absl::Duration period)
    : cluster_(cluster), nodes_(std::move(nodes)), period_(period) {}

Sampler::~Sampler() { Stop(); }

void Sampler::Start() {
  started_ = absl::Now();
  SampleNow();
  thread_ = std::thread([this] { Loop(); });
}

void Sampler::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  thread_.join();
  SampleNow();
}

void Sampler::Loop() {
  absl::Time next = absl::Now() + period_;
  while (!stop_) {
    absl::SleepFor(next - absl::Now());
    next += period_;
    SampleNow();
  }
}

void Sampler::SampleNow() {
  for (int node : nodes_) {
    const NodeAgent& agent = cluster_.nodes[node];
    absl::StatusOr<std::string> body =
        client::HttpGet(agent.metrics_url, absl::Seconds(2));
    if (!body.ok()) continue;  // a missed read widens one interval; nothing more
    NicSample s;
    s.at = absl::Now();
    s.node = node;
    for (const std::string& nic : agent.nic_names) {
      for (bool own : {true, false}) {
        absl::StatusOr<double> v =
            client::MetricValue(*body, "fuselink_nic_transmitted_bytes_total",
                                {{"nic", nic}, {"traffic", own ? "own" : "borrowed"}});
        (own ? s.own_bytes : s.borrowed_bytes).push_back(v.ok() ? *v : 0);
      }
    }
    absl::MutexLock lock(&mu_);
    samples_.push_back(std::move(s));
  }
}

std::vector<NicSample> Sampler::samples() const {
  absl::MutexLock lock(&mu_);
  return samples_;
}

bool Sampler::WriteRates(const std::string& path) const {
  const std::vector<NicSample> all = samples();
  std::ofstream out(path);
  if (!out) return false;
  const size_t nics = all.empty() ? 0 : all.front().own_bytes.size();
  out << "# t_s";
  for (size_t k = 0; k < nics; ++k)
    out << " own" << k << "_gbps borrowed" << k << "_gbps";
  out << "\n";
  // Per node, the previous read; a row per read of the first sampled node, with the
  // other nodes' latest rates added in.
  std::vector<const NicSample*> previous(cluster_.nodes.size(), nullptr);
  std::vector<std::vector<double>> rate(cluster_.nodes.size(),
                                        std::vector<double>(2 * nics, 0));
  for (const NicSample& s : all) {
    const NicSample* p = previous[s.node];
    // Rates over at least 100 ms (and half a period): over shorter intervals whole
    // chunks (8 ms each at 1 MiB and 1 Gbit/s) make the rate jump between steps.
    if (p != nullptr && s.at - p->at < std::max(period_ / 2, absl::Milliseconds(100))) {
      continue;
    }
    previous[s.node] = &s;
    if (p == nullptr) continue;
    const double dt = absl::ToDoubleSeconds(s.at - p->at);
    for (size_t k = 0; k < nics; ++k) {
      rate[s.node][2 * k] = (s.own_bytes[k] - p->own_bytes[k]) * 8 / dt / 1e9;
      rate[s.node][2 * k + 1] =
          (s.borrowed_bytes[k] - p->borrowed_bytes[k]) * 8 / dt / 1e9;
    }
    if (s.node != nodes_.front()) continue;
    out << absl::StrFormat("%.3f", absl::ToDoubleSeconds(s.at - started_));
    for (size_t c = 0; c < 2 * nics; ++c) {
      double sum = 0;
      for (int n : nodes_) sum += rate[n][c];
      out << absl::StrFormat(" %.4f", sum);
    }
    out << "\n";
  }
  return static_cast<bool>(out);
}

int PlotRates(const std::string& dir, const std::string& workload,
              const std::vector<std::string>& policies, int nics,
              const std::string& title, double ymax_gbps, const std::string& png) {
  const std::string script = absl::StrCat(dir, "/", workload, ".gp");
  std::ofstream gp(script);
  gp << "set terminal pngcairo size " << 220 * nics + 80 << ","
     << 150 * policies.size() + 60 << " font 'DejaVu Sans,8'\n"
     << "set output '" << png << "'\n"
     << "set multiplot layout " << policies.size() << "," << nics << " title '" << title
     << "'\n"
     << "set style fill solid 0.6 noborder\nset key top right font ',7'\n"
     << "set yrange [0:" << ymax_gbps
     << "]\nset xlabel 's' offset 0,1\nset tmargin 1.5\n";
  for (size_t p = 0; p < policies.size(); ++p) {
    const std::string data = absl::StrCat(dir, "/", workload, "-", policies[p], ".dat");
    for (int k = 0; k < nics; ++k) {
      const int own = 2 + 2 * k, borrowed = 3 + 2 * k;
      gp << "set title '" << policies[p] << ": NIC " << k << " (GPU " << k
         << ")' offset 0,-0.6\n"
         << "set ylabel '" << (k == 0 ? "Gbit/s sent" : "") << "'\n"
         << "plot '" << data << "' using 1:(column(" << own << ")+column(" << borrowed
         << ")) with filledcurves x1 lc rgb '#e6862e' title '"
         << (k == 0 ? "borrowed" : "") << "', '' using 1:" << own
         << " with filledcurves x1 lc rgb '#2e6fb5' title '" << (k == 0 ? "own" : "")
         << "'\n";
    }
  }
  gp << "unset multiplot\n";
  gp.close();
  const std::string command = absl::StrCat("gnuplot '", script, "'");
  return std::system(command.c_str());
}

}  // namespace fuselink::bench
