// The secrets that let a fabric connection prove which node opened it.
//
// Keys are agreed per peer over the peer bootstrap (gRPC Peer.Hello, itself mutually
// authenticated) and are directional:
//  - the accept key for peer P is made here, at random, and handed to P; whoever
//    connects to this node's fabric under P's name must prove it (handshake.h);
//  - the connect key for P is the one P made and handed to us; we prove it when we
//    connect to P.
// So a node that learns another's connect key cannot use it to pass as a third.
//
// Thread-safe. The table grows by one entry per peer the bootstrap introduces and
// shrinks with Forget; it holds no other state.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace fuselink::fabric {

inline constexpr size_t kSessionKeyBytes = 32;
using SessionKey = std::array<uint8_t, kSessionKeyBytes>;

class FabricKeys {
 public:
  FabricKeys() = default;
  // Wipes every key it still holds.
  ~FabricKeys();
  FabricKeys(const FabricKeys&) = delete;
  FabricKeys& operator=(const FabricKeys&) = delete;

  // The key `peer` must prove when it connects here: made from the kernel's CSPRNG
  // on first use, then the same until Forget. Aborts the process if getrandom(2)
  // fails, which it does only on a kernel without it (< 3.17): a node without a
  // CSPRNG cannot authenticate anyone.
  SessionKey AcceptKey(absl::string_view peer);
  // The accept key for `peer`, if one was made; never makes one.
  std::optional<SessionKey> FindAcceptKey(absl::string_view peer) const;
  // The key `peer` made for us (its AcceptKey for this node); replaces an older one.
  void SetConnectKey(absl::string_view peer, const SessionKey& key);
  std::optional<SessionKey> FindConnectKey(absl::string_view peer) const;
  // Drops both keys of `peer`: its connections are refused until it says Hello again.
  // Connections already authenticated are not affected.
  void Forget(absl::string_view peer);

 private:
  struct Keys {
    std::optional<SessionKey> accept;
    std::optional<SessionKey> connect;
  };

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Keys> keys_ ABSL_GUARDED_BY(mu_);
};

// Fills `out` from getrandom(2) (the kernel's CSPRNG; blocks only until it is seeded
// at boot). The errno becomes a Status here, once.
absl::Status FillRandom(std::span<uint8_t> out);
// A fresh random key.
absl::StatusOr<SessionKey> RandomKey();

}  // namespace fuselink::fabric
