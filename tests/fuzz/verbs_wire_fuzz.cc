// The verbs transport's control frames (agent/fabric/verbs/wire.h) on any bytes:
// DecodeFrame never crashes, and whatever it accepts encodes back to the same 64
// bytes; a HELLO with its name, client nonce and QP records re-encodes to the bytes
// it came from, CHALLENGE and PROOF with their MAC and nonce too.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>

#include "agent/fabric/verbs/wire.h"
#include "tests/fuzz/fuzz_check.h"

namespace fuselink::fabric::verbs::wire {
namespace {

bool Same(const Frame& frame, std::span<const uint8_t, kFrameBytes> in) {
  return std::equal(frame.begin(), frame.end(), in.begin());
}

void CheckHello(const HelloHeader& header, std::span<const uint8_t, kFrameBytes> in,
                std::span<const uint8_t> rest) {
  FL_FUZZ_CHECK(header.qp_count >= 1 && header.qp_count <= kMaxQpsPerHello);
  FL_FUZZ_CHECK(header.name_bytes <= kMaxNameBytes);
  const size_t body = header.name_bytes + size_t{header.qp_count} * kQpInfoBytes;
  if (rest.size() < body) return;
  Hello hello{.nic = header.nic, .mtu = header.mtu, .lid = header.lid, .gid = header.gid};
  hello.client_nonce = header.client_nonce;
  hello.name.assign(reinterpret_cast<const char*>(rest.data()), header.name_bytes);
  hello.qps = DecodeQpInfos(rest.subspan(header.name_bytes, body - header.name_bytes));
  FL_FUZZ_CHECK(hello.qps.size() == header.qp_count);
  absl::StatusOr<std::string> again = EncodeHello(hello);
  FL_FUZZ_CHECK(again.ok() ==
                (hello.name.empty() || fabric::wire::ValidateNodeName(hello.name).ok()));
  if (!again.ok()) return;
  FL_FUZZ_CHECK(again->size() == kFrameBytes + body);
  const auto* bytes = reinterpret_cast<const uint8_t*>(again->data());
  FL_FUZZ_CHECK(std::equal(in.begin(), in.end(), bytes));
  FL_FUZZ_CHECK(std::equal(rest.begin(), rest.begin() + body, bytes + kFrameBytes));
}

// A WINDOW_ADD whose records follow it whole re-encodes to the same bytes.
void CheckWindowAdd(const WindowAdd& add, std::span<const uint8_t, kFrameBytes> in,
                    std::span<const uint8_t> rest) {
  FL_FUZZ_CHECK(add.key != 0);
  FL_FUZZ_CHECK(add.extent_count >= 1 && add.extent_count <= kMaxWindowExtents);
  const size_t body = size_t{add.extent_count} * kWindowRecordBytes;
  if (rest.size() < body) return;
  absl::StatusOr<std::vector<WindowRecord>> records =
      DecodeWindowRecords(rest.subspan(0, body));
  if (!records.ok()) return;
  FL_FUZZ_CHECK(records->size() == add.extent_count);
  absl::StatusOr<std::string> again =
      EncodeWindowAdd(add.key, add.iova_base, add.seq, *records);
  FL_FUZZ_CHECK(again.ok());
  FL_FUZZ_CHECK(again->size() == kFrameBytes + body);
  const auto* bytes = reinterpret_cast<const uint8_t*>(again->data());
  FL_FUZZ_CHECK(std::equal(in.begin(), in.end(), bytes));
  FL_FUZZ_CHECK(std::equal(rest.begin(), rest.begin() + body, bytes + kFrameBytes));
}

}  // namespace
}  // namespace fuselink::fabric::verbs::wire

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fuselink::fabric::verbs::wire;
  const std::span<const uint8_t> all(data, size);
  FL_FUZZ_CHECK(DecodeQpInfos(all).size() == size / kQpInfoBytes);
  if (size < kFrameBytes) return 0;
  const std::span<const uint8_t, kFrameBytes> in(data, kFrameBytes);
  absl::StatusOr<Decoded> decoded = DecodeFrame(in);
  if (!decoded.ok()) {
    FL_FUZZ_CHECK(absl::IsInvalidArgument(decoded.status()));
    return 0;
  }
  std::visit(
      [&](const auto& frame) {
        using T = std::decay_t<decltype(frame)>;
        if constexpr (std::is_same_v<T, HelloHeader>) {
          CheckHello(frame, in, all.subspan(kFrameBytes));
        } else if constexpr (std::is_same_v<T, Refuse>) {
          FL_FUZZ_CHECK(frame.code != absl::StatusCode::kOk);
          FL_FUZZ_CHECK(Same(EncodeRefuse(frame), in));
        } else if constexpr (std::is_same_v<T, WindowAdd>) {
          CheckWindowAdd(frame, in, all.subspan(kFrameBytes));
        } else if constexpr (std::is_same_v<T, WindowRemove>) {
          FL_FUZZ_CHECK(frame.key != 0);
          FL_FUZZ_CHECK(Same(EncodeWindowRemove(frame), in));
        } else if constexpr (std::is_same_v<T, Ready>) {
          FL_FUZZ_CHECK(Same(EncodeReady(), in));
        } else if constexpr (std::is_same_v<T, Ack>) {
          FL_FUZZ_CHECK(Same(EncodeAck(frame), in));
        } else if constexpr (std::is_same_v<T, Query>) {
          FL_FUZZ_CHECK(Same(EncodeQuery(frame), in));
        } else if constexpr (std::is_same_v<T, Verdict>) {
          FL_FUZZ_CHECK(static_cast<uint32_t>(frame.refusal) <=
                        fuselink::fabric::kMaxRefusal);
          FL_FUZZ_CHECK(Same(EncodeVerdict(frame), in));
        } else if constexpr (std::is_same_v<T, QpRenew>) {
          FL_FUZZ_CHECK(frame.psn < (1u << 24));
          FL_FUZZ_CHECK(Same(EncodeQpRenew(frame), in));
        } else if constexpr (std::is_same_v<T, Challenge>) {
          FL_FUZZ_CHECK(Same(EncodeChallenge(frame), in));
        } else if constexpr (std::is_same_v<T, Proof>) {
          FL_FUZZ_CHECK(Same(EncodeProof(frame), in));
        } else {
          static_assert(std::is_same_v<T, QpRenewed>);
          FL_FUZZ_CHECK(frame.psn < (1u << 24));
          FL_FUZZ_CHECK(Same(EncodeQpRenewed(frame), in));
        }
      },
      *decoded);
  return 0;
}
