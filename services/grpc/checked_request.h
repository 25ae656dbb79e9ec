// Requests that reach a callback service's handlers only after their bytes passed
// CheckUtf8Fields (request_utf8.h).
//
// gRPC parses a request before any handler runs; when protobuf refuses the bytes (a
// string field that is not UTF-8, or no protobuf message at all) gRPC ends the call
// UNIMPLEMENTED with no message and no reason. A service derived from
// CheckedService<Grpc> instead registers, for each method it names, a handler whose
// request type is Checked<Request>: its deserializer never fails the call, and the
// handler answers the refusal itself, INVALID_ARGUMENT with reason BAD_UTF8 (naming
// the field) or MALFORMED_REQUEST. The public API (agent.proto, its string fields, the
// Python stubs, grpcurl's JSON) is unchanged; the service's typed methods are called
// as before for every request that parses.
//
// Why this leans on gRPC's internals: the public API gives a handler only a parsed
// message, and gRPC's own deserializer ends a call protobuf refuses before any
// handler (or interceptor) sees it. The only place to keep such a call alive is the
// request type's SerializationTraits, and a request type of our own needs handlers
// registered for it by hand, as grpc_cpp_plugin's generated code does:
//  - grpc::internal::CallbackUnaryHandler and CallbackServerStreamingHandler
//    (grpcpp/impl/codegen/server_callback_handlers.h), made from a std::function
//    of the reactor-returning handler;
//  - grpc::Service::MarkMethodCallback(int index, internal::MethodHandler*), the
//    generated code's way to install them, by the method's index in the .proto;
//  - what the handlers do with the bytes: they call
//    SerializationTraits<Request>::Deserialize, end the call when it fails, and
//    afterwards release only the buffer's handle (so Deserialize clears the buffer).
// These were read in gRPC 1.51 (Debian 12). A gRPC outside the range below
// fails the build here; the static_asserts in CheckedService say which type changed.
// After reading the three points above in the new gRPC, widen the range.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "agent/common/grpc_status.h"
#include "agent/common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/version_info.h"
#include "services/grpc/request_utf8.h"

#if !defined(GRPC_CPP_VERSION_MAJOR) || GRPC_CPP_VERSION_MAJOR != 1 || \
    GRPC_CPP_VERSION_MINOR != 51
#error \
    "services/grpc/checked_request.h uses gRPC internals read in gRPC 1.51 only: \
check the handler types, MarkMethodCallback and Deserialize's buffer ownership \
(the header's opening comment) in this gRPC, then widen the version range"
#endif

namespace fuselink::services {

// A request as a checked handler receives it: `message` is parsed when `status` is
// OK; otherwise `status` says why not, with its reason.
template <typename Message>
struct Checked {
  Message message;
  absl::Status status;
};

// Base of a service that checks its requests' bytes first. `Grpc` is the generated
// service class (v1::Agent); the derived service overrides its CallbackService
// methods as usual and calls Check() once per method in its constructor.
template <typename Grpc>
class CheckedService : public Grpc::CallbackService {
 protected:
  // Replaces the generated handler of the unary `method` with one that answers a
  // refused request itself and passes the rest to `handler`.
  template <typename Derived, typename Request, typename Response>
  void Check(const char* method,
             grpc::ServerUnaryReactor* (Derived::*handler)(grpc::CallbackServerContext*,
                                                           const Request*, Response*)) {
    using Handler = grpc::internal::CallbackUnaryHandler<Checked<Request>, Response>;
    static_assert(
        std::is_base_of_v<grpc::internal::MethodHandler, Handler> &&
            std::is_constructible_v<Handler, std::function<grpc::ServerUnaryReactor*(
                                                 grpc::CallbackServerContext*,
                                                 const Checked<Request>*, Response*)>>,
        "gRPC's CallbackUnaryHandler changed: see checked_request.h's opening comment");
    static_assert(Installs<Handler>(), "gRPC's Service::MarkMethodCallback changed");
    auto* derived = static_cast<Derived*>(this);
    this->MarkMethodCallback(
        MethodIndex(method, *Request::descriptor()),
        new Handler([derived, handler](grpc::CallbackServerContext* context,
                                       const Checked<Request>* request,
                                       Response* response) -> grpc::ServerUnaryReactor* {
          if (!request->status.ok()) {
            grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
            reactor->Finish(ToGrpcStatus(request->status));
            return reactor;
          }
          return (derived->*handler)(context, &request->message, response);
        }));
  }

  // The same for the server-streaming `method`.
  template <typename Derived, typename Request, typename Response>
  void Check(const char* method, grpc::ServerWriteReactor<Response>* (Derived::*handler)(
                                     grpc::CallbackServerContext*, const Request*)) {
    using Handler =
        grpc::internal::CallbackServerStreamingHandler<Checked<Request>, Response>;
    static_assert(
        std::is_base_of_v<grpc::internal::MethodHandler, Handler> &&
            std::is_constructible_v<
                Handler, std::function<grpc::ServerWriteReactor<Response>*(
                             grpc::CallbackServerContext*, const Checked<Request>*)>>,
        "gRPC's CallbackServerStreamingHandler changed: see "
        "checked_request.h's opening comment");
    static_assert(Installs<Handler>(), "gRPC's Service::MarkMethodCallback changed");
    auto* derived = static_cast<Derived*>(this);
    this->MarkMethodCallback(
        MethodIndex(method, *Request::descriptor()),
        new Handler([derived, handler](grpc::CallbackServerContext* context,
                                       const Checked<Request>* request)
                        -> grpc::ServerWriteReactor<Response>* {
          if (!request->status.ok()) return new Refused<Response>(request->status);
          return (derived->*handler)(context, &request->message);
        }));
  }

 private:
  // Whether the service installs a `Handler` by the method's index, as the generated
  // code does (checked here, where the protected member is in reach).
  template <typename Handler>
  static constexpr bool Installs() {
    return requires(CheckedService * service, Handler * h) {
      service->MarkMethodCallback(0, h);
    };
  }

  // Ends a stream at once with `status`.
  template <typename Response>
  class Refused final : public grpc::ServerWriteReactor<Response> {
   public:
    explicit Refused(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
    void OnDone() override { delete this; }
  };

  // The method's index in the service, as the generated code numbers methods (the
  // order of the .proto); aborts on a name or request type the service does not have,
  // which is a programming error caught at the agent's start.
  static int MethodIndex(const char* method,
                         const google::protobuf::Descriptor& request) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            Grpc::service_full_name());
    const google::protobuf::MethodDescriptor* m =
        service != nullptr ? service->FindMethodByName(method) : nullptr;
    if (m == nullptr || m->input_type() != &request) {
      std::fprintf(stderr, "CheckedService: %s has no method %s taking %s\n",
                   Grpc::service_full_name(), method, request.full_name().c_str());
      std::abort();
    }
    return m->index();
  }
};

}  // namespace fuselink::services

// gRPC's deserializer for Checked<Message>: the bytes are checked, then parsed; a
// refusal is left in `status` for the handler, and the call itself goes on.
template <typename Message>
class grpc::SerializationTraits<fuselink::services::Checked<Message>, void> {
 public:
  static grpc::Status Deserialize(grpc::ByteBuffer* buffer,
                                  fuselink::services::Checked<Message>* out) {
    out->status = Parse(buffer, &out->message);
    // A deserializer owns the bytes it was given: gRPC's caller only releases the
    // buffer's handle afterwards (grpcpp's own GenericDeserialize clears it too).
    if (buffer != nullptr) buffer->Clear();
    return grpc::Status::OK;
  }

 private:
  static absl::Status Parse(grpc::ByteBuffer* buffer, Message* message) {
    if (buffer == nullptr || !buffer->Valid()) {
      return fuselink::WithReason(absl::InvalidArgumentError("no request message"),
                                  fuselink::reasons::kMalformedRequest);
    }
    {
      grpc::ProtoBufferReader bytes(buffer);
      FL_RETURN_IF_ERROR(
          fuselink::services::CheckUtf8Fields(*Message::descriptor(), bytes));
    }
    grpc::ProtoBufferReader bytes(buffer);
    if (!message->ParseFromZeroCopyStream(&bytes)) {
      return fuselink::WithReason(
          absl::InvalidArgumentError(
              absl::StrCat("the request is not a ", Message::descriptor()->full_name())),
          fuselink::reasons::kMalformedRequest);
    }
    return absl::OkStatus();
  }
};
