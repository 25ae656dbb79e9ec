#include "tools/fuselinkctl/commands.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "agent/topo/discovery.h"
#include "agent/topo/render.h"
#include "clients/cpp/client.h"
#include "clients/cpp/dial.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, source, "", "transfer: source as node/tensor.");
ABSL_FLAG(std::string, target, "", "transfer: target as node/tensor.");
ABSL_FLAG(std::string, blocks, "", "transfer: source block ids, e.g. 0-63,80.");
ABSL_FLAG(std::string, target_blocks, "",
          "transfer: target block ids; default: --blocks.");
ABSL_FLAG(std::string, layers, "", "transfer: layer range begin:end; default: all.");
ABSL_FLAG(std::string, request_id, "", "transfer: idempotency key; default: random.");
ABSL_FLAG(int, timeout_s, 600, "transfer, demo: deadline in seconds.");
ABSL_FLAG(std::string, tensor, "", "watch: only this tensor.");
ABSL_FLAG(std::string, sysfs_root, "",
          "topology: run discovery here, on this sysfs (e.g. /sys), instead of asking an "
          "agent; as the agent's --sysfs_root. GPUs come from the CUDA driver only for "
          "/sys itself; another tree (a fixture) is read alone.");
ABSL_FLAG(std::vector<std::string>, exclude_nics, {},
          "topology --sysfs_root: NICs to leave out, as the agent's --exclude_nics.");
ABSL_FLAG(bool, time, false, "topology --sysfs_root: also time discovery (to stderr).");

namespace fuselink::ctl {
namespace {

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

bool ParseBlocks(const std::string& text, std::vector<uint32_t>* out) {
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> range = absl::StrSplit(part, '-');
    uint32_t lo = 0, hi = 0;
    if (range.size() == 1 && absl::SimpleAtoi(range[0], &lo)) {
      hi = lo;
    } else if (range.size() != 2 || !absl::SimpleAtoi(range[0], &lo) ||
               !absl::SimpleAtoi(range[1], &hi) || hi < lo) {
      return false;
    }
    for (uint64_t b = lo; b <= hi; ++b) out->push_back(static_cast<uint32_t>(b));
  }
  return !out->empty();
}

bool ParseSide(const std::string& text, v1::BlockSet* side) {
  std::vector<std::string> parts = absl::StrSplit(text, absl::MaxSplits('/', 1));
  if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) return false;
  side->set_node(parts[0]);
  side->set_tensor(parts[1]);
  return true;
}

// Draws the progress line: bar, rate, and each NIC's share of the bytes.
class ProgressLine {
 public:
  void Update(const v1::Progress& p) {
    const double now = absl::ToDoubleSeconds(absl::Now() - start_);
    const double frac = p.total_bytes() ? double(p.bytes_done()) / p.total_bytes() : 0;
    const int width = 30;
    const int filled = static_cast<int>(frac * width);
    std::string line =
        absl::StrFormat("\r[%s%s] %5.1f%% %10s/s ", std::string(filled, '#'),
                        std::string(width - filled, '.'), 100 * frac,
                        Bytes(now > 0 ? p.bytes_done() / now : 0));
    for (const v1::NicBytes& n : p.per_nic()) {
      absl::StrAppendFormat(&line, " %s %3.0f%%", n.nic(),
                            p.bytes_done() ? 100.0 * n.bytes() / p.bytes_done() : 0.0);
    }
    std::fprintf(stderr, "%s", line.c_str());
    std::fflush(stderr);
  }
  void Done() { std::fprintf(stderr, "\n"); }

 private:
  absl::Time start_ = absl::Now();
};

std::string RandomId() {
  std::random_device rd;
  return absl::StrFormat("ctl-%08x%08x", rd(), rd());
}

}  // namespace

int Failed(const grpc::Status& status) {
  std::fprintf(stderr, "error: %s (%d %s)\n", status.error_message().c_str(),
               status.error_code(), client::ReasonOf(status).c_str());
  return 1;
}

int FailedStatus(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  return 1;
}

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return absl::StrFormat("%.1f %s", b, units[u]);
}

int Follow(Context& ctx, const v1::TransferRequest& request,
           const std::function<void(const v1::TransferEvent&)>& also) {
  ProgressLine bar;
  bool drew = false;
  client::TransferOutcome outcome = client::RunTransfer(
      *ctx.agent, request,
      [&](const v1::TransferEvent& e) {
        if (also) also(e);
        if (ctx.json) {
          std::printf("%s\n", Json(e).c_str());
          return;
        }
        if (e.has_accepted()) {
          std::printf("transfer %s accepted: %s in %lu chunks over %s, policy %s\n",
                      e.transfer_id().c_str(), Bytes(e.accepted().total_bytes()).c_str(),
                      static_cast<unsigned long>(e.accepted().chunks()),
                      e.accepted().transport().c_str(), e.accepted().policy().c_str());
        } else if (e.has_progress()) {
          bar.Update(e.progress());
          drew = true;
        } else if (e.has_completed()) {
          v1::Progress p;
          p.set_bytes_done(e.completed().total_bytes());
          p.set_total_bytes(e.completed().total_bytes());
          *p.mutable_per_nic() = e.completed().per_nic();
          bar.Update(p);
          bar.Done();
          drew = false;
          const double s = e.completed().seconds();
          std::printf("completed: %s in %.3f s, %s/s\n",
                      Bytes(e.completed().total_bytes()).c_str(), s,
                      Bytes(s > 0 ? e.completed().total_bytes() / s : 0).c_str());
          for (const v1::NicBytes& n : e.completed().per_nic()) {
            std::printf("  %-8s %s\n", n.nic().c_str(), Bytes(n.bytes()).c_str());
          }
        } else if (e.has_failed()) {
          if (drew) bar.Done();
          std::printf("failed: %s (%s)\n", e.failed().message().c_str(),
                      e.failed().reason().c_str());
        }
      },
      absl::Seconds(absl::GetFlag(FLAGS_timeout_s)) + absl::Seconds(5));
  if (!outcome.status.ok()) return FailedStatus(outcome.status);
  return 0;
}

int Topology(Context& ctx) {
  v1::Topology t;
  grpc::Status s = Call([&](grpc::ClientContext* c) {
    return ctx.agent->GetTopology(c, v1::GetTopologyRequest(), &t);
  });
  if (!s.ok()) return Failed(s);
  if (ctx.json) return std::printf("%s\n", Json(t).c_str()), 0;
  std::printf("%s", topo::RenderTopology(t).c_str());
  std::printf("\n%-10s %-16s %s\n", "NIC", "ADDRESS", "PORT");
  for (const v1::Nic& n : t.nics()) {
    std::printf("%-10s %-16s %u\n", n.name().c_str(), n.address().c_str(), n.port());
  }
  return 0;
}

int OfflineTopology(bool json) {
  const topo::NodeDiscovery discovery(absl::GetFlag(FLAGS_sysfs_root),
                                      absl::GetFlag(FLAGS_exclude_nics),
                                      /*cuda_allowed=*/true);
  const absl::Time start = absl::Now();
  absl::StatusOr<topo::Topology> t = discovery.Run();
  const absl::Duration first = absl::Now() - start;
  if (!t.ok()) return FailedStatus(t.status());
  if (json) {
    std::printf("%s\n", Json(*t).c_str());
  } else {
    std::printf("%s", topo::RenderTopology(*t).c_str());
    if (absl::Status usable = topo::RequireDataNics(*t); !usable.ok()) {
      std::printf("\nthe agent would not start here: %s\n",
                  std::string(usable.message()).c_str());
    }
  }
  if (absl::GetFlag(FLAGS_time)) {
    // The first run reads sysfs cold (and loads the CUDA driver where there is one);
    // the repeats show the steady cost of one discovery.
    constexpr int kRepeats = 20;
    std::vector<double> ms;
    for (int i = 0; i < kRepeats; ++i) {
      const absl::Time t0 = absl::Now();
      if (!discovery.Run().ok()) break;
      ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    }
    std::sort(ms.begin(), ms.end());
    std::fprintf(
        stderr,
        "discovery of %s: first %.2f ms, median of %zu repeats %.2f ms, min %.2f ms\n",
        discovery.sysfs_root().c_str(), absl::ToDoubleMilliseconds(first), ms.size(),
        ms.empty() ? 0.0 : ms[ms.size() / 2], ms.empty() ? 0.0 : ms.front());
  }
  return 0;
}

int Tensors(Context& ctx) {
  v1::ListTensorsRequest request;
  if (!ctx.json) {
    std::printf("%-32s %-6s %-7s %-9s %-12s %s\n", "NAME", "LAYERS", "BLOCKS", "BLOCK",
                "SIZE", "MEMORY");
  }
  do {
    v1::ListTensorsResponse page;
    grpc::Status s = Call([&](grpc::ClientContext* c) {
      return ctx.agent->ListTensors(c, request, &page);
    });
    if (!s.ok()) return Failed(s);
    for (const v1::Tensor& t : page.tensors()) {
      if (ctx.json) {
        std::printf("%s\n", Json(t).c_str());
        continue;
      }
      std::printf("%-32s %-6u %-7u %-9s %-12s %s\n", t.name().c_str(),
                  t.layout().layers(), t.layout().blocks_per_layer(),
                  Bytes(t.layout().block_bytes()).c_str(), Bytes(t.size_bytes()).c_str(),
                  t.memory_kind().c_str());
    }
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return 0;
}

int Tensor(Context& ctx, const std::vector<std::string>& args) {
  if (args.size() != 2 || (args[0] != "get" && args[0] != "unregister")) {
    std::fprintf(stderr, "usage: fuselinkctl tensor get|unregister NAME\n");
    return 2;
  }
  if (args[0] == "unregister") {
    v1::UnregisterTensorRequest request;
    request.set_name(args[1]);
    v1::UnregisterTensorResponse response;
    grpc::Status s = Call([&](grpc::ClientContext* c) {
      return ctx.agent->UnregisterTensor(c, request, &response);
    });
    if (!s.ok()) return Failed(s);
    if (!ctx.json) std::printf("unregistered %s\n", args[1].c_str());
    return 0;
  }
  v1::GetTensorRequest request;
  request.set_name(args[1]);
  v1::Tensor t;
  grpc::Status s =
      Call([&](grpc::ClientContext* c) { return ctx.agent->GetTensor(c, request, &t); });
  if (!s.ok()) return Failed(s);
  std::printf("%s\n", Json(t).c_str());
  return 0;
}

int Transfer(Context& ctx, const std::vector<std::string>&) {
  v1::TransferRequest request;
  std::vector<uint32_t> source_blocks, target_blocks;
  std::string target_text = absl::GetFlag(FLAGS_target_blocks);
  if (!ParseSide(absl::GetFlag(FLAGS_source), request.mutable_source()) ||
      !ParseSide(absl::GetFlag(FLAGS_target), request.mutable_target()) ||
      !ParseBlocks(absl::GetFlag(FLAGS_blocks), &source_blocks) ||
      !ParseBlocks(target_text.empty() ? absl::GetFlag(FLAGS_blocks) : target_text,
                   &target_blocks)) {
    std::fprintf(stderr,
                 "usage: fuselinkctl transfer --source=node/tensor --target=node/tensor "
                 "--blocks=0-63 [--target_blocks=..] [--layers=b:e]\n");
    return 2;
  }
  *request.mutable_source()->mutable_block_ids() = {source_blocks.begin(),
                                                    source_blocks.end()};
  *request.mutable_target()->mutable_block_ids() = {target_blocks.begin(),
                                                    target_blocks.end()};
  if (std::string layers = absl::GetFlag(FLAGS_layers); !layers.empty()) {
    std::vector<std::string> be = absl::StrSplit(layers, ':');
    uint32_t b, e;
    if (be.size() != 2 || !absl::SimpleAtoi(be[0], &b) || !absl::SimpleAtoi(be[1], &e)) {
      std::fprintf(stderr, "--layers wants begin:end\n");
      return 2;
    }
    request.mutable_layers()->set_begin(b);
    request.mutable_layers()->set_end(e);
  }
  std::string rid = absl::GetFlag(FLAGS_request_id);
  request.set_request_id(rid.empty() ? RandomId() : rid);
  const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  request.mutable_deadline()->set_seconds(absl::ToUnixSeconds(deadline));
  return Follow(ctx, request);
}

int Status(Context& ctx, const std::vector<std::string>& args) {
  if (args.size() != 1) return std::fprintf(stderr, "usage: fuselinkctl status ID\n"), 2;
  v1::GetTransferRequest request;
  request.set_transfer_id(args[0]);
  v1::TransferStatus status;
  grpc::Status s = Call([&](grpc::ClientContext* c) {
    return ctx.agent->GetTransfer(c, request, &status);
  });
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) {  // maybe a request id
    request.clear_transfer_id();
    request.set_request_id(args[0]);
    s = Call([&](grpc::ClientContext* c) {
      return ctx.agent->GetTransfer(c, request, &status);
    });
  }
  if (!s.ok()) return Failed(s);
  std::printf("%s\n", Json(status).c_str());
  return 0;
}

int Cancel(Context& ctx, const std::vector<std::string>& args) {
  if (args.size() != 1) return std::fprintf(stderr, "usage: fuselinkctl cancel ID\n"), 2;
  v1::CancelTransferRequest request;
  request.set_transfer_id(args[0]);
  v1::TransferStatus status;
  grpc::Status s = Call([&](grpc::ClientContext* c) {
    return ctx.agent->CancelTransfer(c, request, &status);
  });
  if (!s.ok()) return Failed(s);
  std::printf("%s\n", ctx.json ? Json(status).c_str() : "cancelling");
  return 0;
}

int Watch(Context& ctx) {
  v1::WatchTransfersRequest request;
  request.set_tensor(absl::GetFlag(FLAGS_tensor));
  grpc::ClientContext context;
  auto reader = ctx.agent->WatchTransfers(&context, request);
  v1::WatchEvent e;
  while (reader->Read(&e)) {
    if (ctx.json) {
      std::printf("%s\n", Json(e).c_str());
    } else {
      std::printf("%s %s from %s into %s: %d blocks x layers [%u, %u), %s\n",
                  e.code() == 0 ? "READY " : "FAILED", e.transfer_id().c_str(),
                  e.source_node().c_str(), e.tensor().c_str(), e.block_ids_size(),
                  e.layers().begin(), e.layers().end(), Bytes(e.bytes()).c_str());
    }
    std::fflush(stdout);
  }
  grpc::Status s = reader->Finish();
  return s.ok() || s.error_code() == grpc::StatusCode::CANCELLED ? 0 : Failed(s);
}

}  // namespace fuselink::ctl
