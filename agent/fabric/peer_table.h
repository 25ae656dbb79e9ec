// The peers one fabric knows, for both transports: ids by name, each with the links
// that carry it (TCP connections, verbs control links). A name resolves to at most one
// live peer; a retired peer (disconnected here, or found with nothing left) is out of
// the name index but keeps its id until its last link is gone, so that its loss is
// still reported once. Ids are never reused. Not thread-safe: the fabric's lock
// guards it. And the per-name locks both fabrics' Connects take.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "agent/fabric/fabric.h"

namespace fuselink::fabric {

// `LinkPtr` points to a type with Close(const absl::Status&).
template <typename LinkPtr>
class PeerTable {
 public:
  struct Peer {
    std::string name;
    bool retired = false;
    std::vector<LinkPtr> links;  // every role, every NIC
  };

  // The live peer called `name`, if any.
  std::optional<PeerId> Find(absl::string_view name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return std::nullopt;
    return it->second;
  }
  // A new live peer called `name` (retire the old one first).
  PeerId Add(absl::string_view name) {
    const PeerId id = next_id_++;
    peers_.emplace(id, Peer{.name = std::string(name), .retired = false, .links = {}});
    by_name_.emplace(std::string(name), id);
    return id;
  }
  // Null once the peer is gone.
  Peer* Get(PeerId id) {
    auto it = peers_.find(id);
    return it == peers_.end() ? nullptr : &it->second;
  }
  const Peer* Get(PeerId id) const {
    auto it = peers_.find(id);
    return it == peers_.end() ? nullptr : &it->second;
  }
  // Takes the peer out of the name index; idempotent.
  void Retire(PeerId id) {
    Peer* peer = Get(id);
    if (peer == nullptr || peer->retired) return;
    peer->retired = true;
    by_name_.erase(peer->name);
  }
  // The peer's name, or empty once it is gone.
  std::string Name(PeerId id) const {
    auto it = peers_.find(id);
    return it == peers_.end() ? std::string() : it->second.name;
  }
  // Retires the peer and closes its links, CANCELLED.
  void Disconnect(PeerId id) {
    Retire(id);
    if (Peer* peer = Get(id)) {
      for (const LinkPtr& link : peer->links) {
        link->Close(absl::CancelledError("disconnected locally"));
      }
    }
  }
  // Forgets the peer (its id no longer resolves); its name, to report the loss.
  std::string Forget(PeerId id) {
    Retire(id);
    auto it = peers_.find(id);
    std::string name = std::move(it->second.name);
    peers_.erase(it);
    return name;
  }
  // Drops `link` from the peer; when it was the last, forgets the peer and returns
  // its name, else nothing.
  std::optional<std::string> RemoveLink(PeerId id, const LinkPtr& link) {
    Peer* peer = Get(id);
    if (peer == nullptr) return std::nullopt;
    std::erase(peer->links, link);
    if (!peer->links.empty()) return std::nullopt;
    return Forget(id);
  }

 private:
  PeerId next_id_ = 1;
  std::map<PeerId, Peer> peers_;
  std::map<std::string, PeerId, std::less<>> by_name_;
};

// One Connect at a time per peer name (its handshakes may take seconds), so that an
// unreachable peer never holds up Connects to the others. Taken before the fabric's
// lock; the map only grows, by the names this node connects to. Thread-safe.
class ConnectLocks {
 public:
  absl::Mutex& For(absl::string_view peer_name) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<absl::Mutex>& m = locks_[peer_name];
    if (m == nullptr) m = std::make_unique<absl::Mutex>();
    return *m;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<absl::Mutex>> locks_
      ABSL_GUARDED_BY(mu_);
};

// What OnPeerLost reports for a peer whose last link closed with `why`: CANCELLED
// when this side closed deliberately, UNAVAILABLE otherwise.
inline absl::Status PeerLostStatus(const absl::Status& why) {
  if (why.code() == absl::StatusCode::kCancelled) return why;
  return absl::UnavailableError(absl::StrCat("peer lost: ", why.message()));
}

}  // namespace fuselink::fabric
