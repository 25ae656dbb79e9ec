// fuselinkctl: the command line for people (and, with --json, scripts).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "clients/cpp/dial.h"
#include "grpcpp/grpcpp.h"
#include "tools/fuselinkctl/commands.h"

ABSL_FLAG(std::string, agent, "127.0.0.1:50051", "The agent's gRPC address.");
ABSL_FLAG(bool, json, false, "Print JSON instead of text.");
ABSL_DECLARE_FLAG(std::string, sysfs_root);

constexpr char kUsage[] = R"(fuselinkctl [--agent=host:port] [--json] TLS COMMAND

TLS: --tls_cert=F --tls_key=F --tls_ca=F [--tls_server_name=NAME] (scripts/certs.sh
makes them; the certificate's identity decides what it may do: a router's for
transfer/status/cancel, an engine's for its own tensors, a viewer's to look), or
--plaintext for an agent started with --plaintext.

Commands:
  topology                      the agent's GPUs, NICs, GPU x NIC classes, owners and
                                excluded NICs; --sysfs_root=/sys runs discovery
                                here without an agent ([--exclude_nics=..] [--time])
  tensors                       registered tensors
  tensor get|unregister NAME    one tensor
  transfer                      move blocks: --source=node/tensor --target=node/tensor
                                --blocks=0-63 [--target_blocks=..] [--layers=0:32]
                                [--request_id=..] [--timeout_s=..]
  status ID | cancel ID         a transfer, by transfer id or request id
  watch [--tensor=NAME]         transfers landing on this node, as they finish
  top [--metrics=host:port]     live view of the node's NICs and transfers, every
                                --interval_ms (1000); --frames=N to stop after N
  demo                          register synthetic KV caches on --agent (source) and
                                --target_agent, move them, verify the bytes; as
                                --engine_tls_cert/--engine_tls_key (default:
                                --tls_cert) to register, as --tls_cert to move)";

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // scripts read it line by line
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> args(positional.begin() + 1, positional.end());
  if (args.empty()) {
    std::fprintf(stderr, "%s\n", kUsage);
    return 2;
  }
  if (args[0] == "topology" && !absl::GetFlag(FLAGS_sysfs_root).empty()) {
    return fuselink::ctl::OfflineTopology(absl::GetFlag(FLAGS_json));
  }
  fuselink::ctl::Context ctx;
  ctx.agent_address = absl::GetFlag(FLAGS_agent);
  ctx.json = absl::GetFlag(FLAGS_json);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      fuselink::client::DialAgent(ctx.agent_address);
  if (!channel.ok()) {
    std::fprintf(stderr, "fuselinkctl: %s\n",
                 std::string(channel.status().message()).c_str());
    return 2;
  }
  ctx.agent = fuselink::v1::Agent::NewStub(*channel);
  const std::string command = args[0];
  args.erase(args.begin());
  using namespace fuselink::ctl;
  if (command == "topology") return Topology(ctx);
  if (command == "tensors") return Tensors(ctx);
  if (command == "tensor") return Tensor(ctx, args);
  if (command == "transfer") return Transfer(ctx, args);
  if (command == "status") return Status(ctx, args);
  if (command == "cancel") return Cancel(ctx, args);
  if (command == "watch") return Watch(ctx);
  if (command == "demo") return Demo(ctx);
  if (command == "top") return Top(ctx);
  std::fprintf(stderr, "unknown command '%s'\n%s\n", command.c_str(), kUsage);
  return 2;
}
