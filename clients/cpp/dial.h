// How the tools (fuselinkctl, fuselink-bench) reach an agent: mutual TLS from the
// --tls_* flags this library defines, or, only when --plaintext is given, no TLS.
//
// A tool speaks as one identity per channel. Most calls need one: a router's
// certificate for transfers, an engine's for its own tensors, a viewer's to look.
// The tools that both register tensors and move them (fuselinkctl demo,
// fuselink-bench) take a second pair, --engine_tls_cert/--engine_tls_key, for the
// registrations, as an engine and a router would run under the default policy.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace fuselink::client {

enum class Speaker {
  kCaller,  // --tls_cert, --tls_key
  kEngine,  // --engine_tls_cert, --engine_tls_key; each defaults to the caller's
};

// INVALID_ARGUMENT (saying which flags to pass) when neither complete TLS flags nor
// --plaintext were given, or both; whatever security::ClientChannel answers for
// unreadable files.
absl::StatusOr<std::shared_ptr<grpc::Channel>> DialAgent(
    const std::string& address, Speaker speaker = Speaker::kCaller);

}  // namespace fuselink::client
