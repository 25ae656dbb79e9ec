// The TCP fabric's frame header (agent/fabric/wire.h) on any bytes: DecodeHeader never
// crashes, and whatever it accepts encodes back to the same 40 bytes (every field
// is checked, unused ones must be zero, so decoding is one to one). HELLO names and
// ValidateNodeName: a name it accepts makes a HELLO that decodes to it. CHALLENGE and
// PROOF with the MAC that follows them re-encode to the same bytes; a REFUSE names a
// known reason.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <variant>

#include "agent/fabric/wire.h"
#include "tests/fuzz/fuzz_check.h"

namespace fuselink::fabric::wire {
namespace {

bool Printable(absl::string_view name) {
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

bool SameBytes(const HeaderBytes& header, std::span<const uint8_t, kHeaderBytes> in) {
  return std::equal(header.begin(), header.end(), in.begin());
}

void CheckName(absl::string_view name) {
  const bool valid = ValidateNodeName(name).ok();
  FL_FUZZ_CHECK(valid ==
                (!name.empty() && name.size() <= kMaxNodeNameBytes && Printable(name)));
  handshake::Nonce nonce;
  for (size_t i = 0; i < nonce.size(); ++i)
    nonce[i] = static_cast<uint8_t>(name.size() + i);
  absl::StatusOr<std::string> hello = EncodeHello(kMaxWireNics - 1, name, nonce);
  FL_FUZZ_CHECK(hello.ok() == valid);
  if (!valid) return;
  FL_FUZZ_CHECK(hello->size() == kHeaderBytes + name.size());
  const auto* bytes = reinterpret_cast<const uint8_t*>(hello->data());
  absl::StatusOr<Header> decoded =
      DecodeHeader(std::span<const uint8_t, kHeaderBytes>(bytes, kHeaderBytes), 0);
  FL_FUZZ_CHECK(decoded.ok());
  const auto* h = std::get_if<HelloHeader>(&*decoded);
  FL_FUZZ_CHECK(h != nullptr && h->nic == kMaxWireNics - 1 &&
                h->name_bytes == name.size());
  FL_FUZZ_CHECK(h->client_nonce == nonce);
  FL_FUZZ_CHECK(absl::string_view(*hello).substr(kHeaderBytes) == name);
}

void CheckHeader(std::span<const uint8_t, kHeaderBytes> in, absl::string_view rest) {
  // The largest limit a fabric may have, and a small one: what the small one takes,
  // the large one takes too.
  absl::StatusOr<Header> small = DecodeHeader(in, 4096);
  absl::StatusOr<Header> decoded = DecodeHeader(in, kMaxWriteBytesLimit);
  if (small.ok()) FL_FUZZ_CHECK(decoded.ok());
  if (!decoded.ok()) {
    FL_FUZZ_CHECK(absl::IsInvalidArgument(decoded.status()));
    return;
  }
  if (const auto* hello = std::get_if<HelloHeader>(&*decoded)) {
    FL_FUZZ_CHECK(hello->nic < kMaxWireNics);
    FL_FUZZ_CHECK(hello->name_bytes >= 1 && hello->name_bytes <= kMaxNodeNameBytes);
    if (rest.size() < hello->name_bytes) return;
    const absl::string_view name = rest.substr(0, hello->name_bytes);
    absl::StatusOr<std::string> again =
        EncodeHello(hello->nic, name, hello->client_nonce);
    FL_FUZZ_CHECK(again.ok() == ValidateNodeName(name).ok());
    if (again.ok()) {
      FL_FUZZ_CHECK(std::equal(in.begin(), in.end(),
                               reinterpret_cast<const uint8_t*>(again->data())));
      FL_FUZZ_CHECK(absl::string_view(*again).substr(kHeaderBytes) == name);
    }
  } else if (const auto* write = std::get_if<WriteHeader>(&*decoded)) {
    FL_FUZZ_CHECK(write->bytes <= kMaxWriteBytesLimit);
    FL_FUZZ_CHECK(small.ok() == (write->bytes <= 4096));
    FL_FUZZ_CHECK(SameBytes(EncodeWrite(*write), in));
  } else if (const auto* ack = std::get_if<AckFrame>(&*decoded)) {
    FL_FUZZ_CHECK(SameBytes(EncodeAck(*ack), in));
  } else if (const auto* refuse = std::get_if<RefuseHeader>(&*decoded)) {
    FL_FUZZ_CHECK(static_cast<uint32_t>(refuse->why) >= 1 &&
                  static_cast<uint32_t>(refuse->why) <= kMaxConnectionRefusal);
    FL_FUZZ_CHECK(SameBytes(EncodeRefuse(*refuse), in));
  } else {
    // CHALLENGE or PROOF: the header and the MAC after it, byte for byte.
    if (rest.size() < handshake::kMacBytes) return;
    handshake::Mac mac;
    std::memcpy(mac.data(), rest.data(), mac.size());
    const auto* challenge = std::get_if<ChallengeHeader>(&*decoded);
    FL_FUZZ_CHECK(challenge != nullptr || std::holds_alternative<ProofHeader>(*decoded));
    const std::string again = challenge != nullptr
                                  ? EncodeChallenge(challenge->server_nonce, mac)
                                  : EncodeProof(mac);
    FL_FUZZ_CHECK(again.size() == kHeaderBytes + handshake::kMacBytes);
    FL_FUZZ_CHECK(
        std::equal(in.begin(), in.end(), reinterpret_cast<const uint8_t*>(again.data())));
    FL_FUZZ_CHECK(absl::string_view(again).substr(kHeaderBytes) ==
                  rest.substr(0, handshake::kMacBytes));
  }
}

}  // namespace
}  // namespace fuselink::fabric::wire

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fuselink::fabric::wire;
  const absl::string_view all(reinterpret_cast<const char*>(data), size);
  if (size < kHeaderBytes) {
    CheckName(all);
    return 0;
  }
  CheckHeader(std::span<const uint8_t, kHeaderBytes>(data, kHeaderBytes),
              all.substr(kHeaderBytes));
  CheckName(all.substr(kHeaderBytes));
  return 0;
}
