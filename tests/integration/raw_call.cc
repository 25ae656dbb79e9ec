#include "tests/integration/raw_call.h"

#include "absl/time/clock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/integration/pki.h"

namespace fuselink::testing {
namespace {

// One operation at a time on the call's queue: true when it succeeded.
bool Await(grpc::CompletionQueue& queue, void* tag) {
  void* got = nullptr;
  bool ok = false;
  if (!queue.Next(&got, &ok)) return false;
  EXPECT_EQ(got, tag);
  return ok;
}

}  // namespace

RawResult RawCall(const std::string& address, const std::string& method,
                  const std::string& request, absl::Duration timeout) {
  RawResult result;
  grpc::GenericStub stub(ClientChannel(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::CompletionQueue queue;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &queue);
  int tags[5];
  call->StartCall(&tags[0]);
  if (Await(queue, &tags[0])) {
    grpc::Slice slice(request);
    grpc::ByteBuffer buffer(&slice, 1);
    // A server that refuses at once may have ended the call before the write: the
    // status says why either way.
    call->Write(buffer, &tags[1]);
    if (Await(queue, &tags[1])) {
      call->WritesDone(&tags[2]);
      Await(queue, &tags[2]);
    }
    for (;;) {
      grpc::ByteBuffer response;
      call->Read(&response, &tags[3]);
      if (!Await(queue, &tags[3])) break;
      std::vector<grpc::Slice> slices;
      EXPECT_TRUE(response.Dump(&slices).ok());
      std::string bytes;
      for (const grpc::Slice& s : slices) {
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
      result.responses.push_back(std::move(bytes));
    }
  }
  call->Finish(&result.status, &tags[4]);
  Await(queue, &tags[4]);
  queue.Shutdown();
  void* ignored_tag;
  bool ignored_ok;
  while (queue.Next(&ignored_tag, &ignored_ok)) {
  }
  return result;
}

std::string Replace(std::string bytes, absl::string_view marker, absl::string_view with) {
  EXPECT_EQ(marker.size(), with.size());
  const size_t at = bytes.find(marker.data(), 0, marker.size());
  EXPECT_NE(at, std::string::npos) << "no marker";
  if (at == std::string::npos || marker.size() != with.size()) return "";
  EXPECT_EQ(bytes.find(marker.data(), at + 1, marker.size()), std::string::npos)
      << "the marker is there twice";
  bytes.replace(at, marker.size(), with.data(), with.size());
  return bytes;
}

}  // namespace fuselink::testing
