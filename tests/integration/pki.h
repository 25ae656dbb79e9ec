// The certificates the integration tests run on: a CA and per-agent and per-client
// certificates, made by scripts/certs.sh on first use into a directory that lives as
// long as the test binary. Agents started by AgentProcess run with mutual TLS and a
// policy that adds, to the default one, the harness's own client identity
// (spiffe://fuselink/test/client) with the router, engine and viewer roles, so that
// one stub can register, move and watch; tests of access control itself use the
// default policy and the role certificates (Credentials(kind, name)). Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"

namespace fuselink::testing {

// The PKI directory (DIR/ca.crt, DIR/<kind>-<name>.{crt,key}).
const std::string& PkiDir();
// Makes DIR/<kind>-<name>.{crt,key} once, signed by the CA of `dir` (default: the
// PkiDir CA); returns DIR/<kind>-<name> (add ".crt" or ".key"). `days` -1: expired.
std::string MakeCert(const std::string& kind, const std::string& name,
                     const std::string& dir = "", int days = 30);
// The flags an agent needs for mutual TLS as node `node`: with the harness's policy,
// or (harness_policy false) the agent's built-in default.
std::vector<std::string> AgentTlsFlags(const std::string& node,
                                       bool harness_policy = true);
// A channel to `address` that trusts `ca_file` and presents the certificate
// `stem`.crt / `stem`.key (none when `stem` is empty).
std::shared_ptr<grpc::Channel> ChannelWith(const std::string& address,
                                           const std::string& ca_file,
                                           const std::string& stem);
// A channel to the agent at `address` presenting <kind>-<name>'s certificate, or
// none at all (kind empty).
std::shared_ptr<grpc::Channel> ClientChannel(const std::string& address,
                                             const std::string& kind = "test",
                                             const std::string& name = "client");

// Mutual-TLS credentials for a server of the test's own that speaks as
// <kind>-<name> (a stand-in peer): it trusts the PkiDir CA and requires a client
// certificate, as an agent does.
std::shared_ptr<grpc::ServerCredentials> ServerCredentialsAs(const std::string& kind,
                                                             const std::string& name);

}  // namespace fuselink::testing
