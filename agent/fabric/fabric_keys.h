// PLACEHOLDER until the fabric-auth branch lands (same interface).
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace fuselink::fabric {
using SessionKey = std::array<uint8_t, 32>;
class FabricKeys {
 public:
  SessionKey AcceptKey(absl::string_view peer);
  std::optional<SessionKey> FindAcceptKey(absl::string_view peer) const;
  void SetConnectKey(absl::string_view peer, const SessionKey& key);
  std::optional<SessionKey> FindConnectKey(absl::string_view peer) const;
  void Forget(absl::string_view peer);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, SessionKey, std::less<>> accept_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, SessionKey, std::less<>> connect_ ABSL_GUARDED_BY(mu_);
};
absl::StatusOr<SessionKey> RandomKey();
}  // namespace fuselink::fabric
