// The verbs fabric's links and peers (the class: verbs/fabric_impl.h): a peer's control
// links, one per NIC, opened by Connect or accepted, each carrying its QPs; an accepted
// link is attached to its peer once proven, within that peer's share of accepted links;
// a peer is lost once none of its links holds it up, and finished links are reaped.
#include <algorithm>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/checks.h"
#include "agent/fabric/handshake.h"
#include "agent/fabric/verbs/fabric_impl.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric {
namespace verbs_internal {
namespace {

// How long Connect waits for one control connection's TCP handshake.
constexpr int kControlConnectTimeoutMs = 10'000;

}  // namespace

LinkPtr VerbsFabric::NewLink(int nic, ControlLink::Role role, UniqueFd fd) {
  const uint64_t id = next_link_id_++;
  auto link = std::make_shared<ControlLink>(*this, *nics_[nic], id, role, std::move(fd));
  links_.emplace(id, LinkEntry{.link = link});
  return link;
}

PeerId VerbsFabric::LivePeer(absl::string_view name) {
  if (std::optional<PeerId> id = peers_.Find(name)) return *id;
  return peers_.Add(name);
}

void VerbsFabric::AttachLocked(LinkEntry& entry, PeerId peer_id) {
  entry.peer = peer_id;
  Peer* peer = peers_.Get(peer_id);
  peer->links.push_back(entry.link);
  for (VerbsQp* qp : entry.link->qps()) {
    if (qp != nullptr) entry.link->nic().Activate(qp, peer_id, peer->name);
  }
}

std::optional<std::string> VerbsFabric::LoseIfDone(PeerId peer_id) {
  const Peer* peer = peers_.Get(peer_id);
  if (peer == nullptr) return std::nullopt;
  for (const LinkPtr& link : peer->links) {
    auto entry = links_.find(link->id());
    if (entry != links_.end() && entry->second.alive()) return std::nullopt;
  }
  return peers_.Forget(peer_id);
}

absl::StatusOr<PeerId> VerbsFabric::Connect(absl::string_view peer_name,
                                            const std::vector<Endpoint>& remote) {
  FL_MAY_BLOCK();  // the handshakes
  FL_RETURN_IF_ERROR(wire::ValidateNodeName(peer_name));
  FL_RETURN_IF_ERROR(CheckRemoteEndpoints(remote, endpoints_.size()));
  absl::MutexLock connect_lock(&connect_locks_.For(peer_name));
  NicSet missing = FirstNics(remote.size());  // NICs without live QPs to the peer
  std::optional<PeerId> existing;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (std::optional<PeerId> id = peers_.Find(peer_name)) {
      for (const LinkPtr& link : peers_.Get(*id)->links) {
        auto entry = links_.find(link->id());
        if (link->role() == ControlLink::Role::kOutbound && entry != links_.end() &&
            entry->second.live_qps > 0) {
          missing.reset(link->nic().index());
          existing = id;
        }
      }
    }
  }
  if (existing && missing.none()) return *existing;
  const std::optional<SessionKey> key = options_.keys->FindConnectKey(peer_name);
  if (!key.has_value()) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "no fabric key for '", BoundedForMessage(peer_name),
                          "': the peer bootstrap has not introduced it yet")),
                      reasons::kFabricNoKey);
  }
  std::vector<LinkPtr> made;
  // Partial set-up across NICs rolls back: closing a link tears its QPs down (ERR,
  // flush, destroy on the poller); its thread never started, so it is finished, and
  // the reaper drops it once no QP is left (at once when it made none).
  absl::Status failure = absl::UnavailableError("connect abandoned");
  absl::Cleanup rollback = [&] {
    absl::MutexLock lock(&mu_);
    for (const LinkPtr& link : made) {
      link->Close(failure);
      if (auto it = links_.find(link->id()); it != links_.end()) {
        it->second.finished = true;
        MaybeReap(it->first, it->second);
      }
    }
  };
  // A connected peer whose failed NICs cannot be re-opened yet stays connected on the
  // others: the partial set-up rolls back and its id is returned.
  auto fail = [&](absl::Status why) -> absl::StatusOr<PeerId> {
    failure = why;
    if (existing) return *existing;
    return why;
  };
  for (size_t nic = 0; nic < remote.size(); ++nic) {
    if (!missing.test(nic)) continue;
    const std::string context = absl::StrCat(
        "Connect to '", peer_name, "': NIC ", nic, " (", endpoints_[nic].address, " -> ",
        remote[nic].address, ":", remote[nic].port, ")");
    absl::StatusOr<SocketAddress> target =
        ParseSocketAddress(remote[nic].address, remote[nic].port);
    absl::StatusOr<UniqueFd> socket = target.ok()
                                          ? BoundDataSocket(local_[nic], *target)
                                          : absl::StatusOr<UniqueFd>(target.status());
    if (!socket.ok()) return fail(WithContext(socket.status(), context));
    // Tracked until the handshake ends; the link closes the socket only when it is
    // destroyed, after the ticket (`made` holds it past this iteration).
    absl::StatusOr<PendingSockets::Ticket> pending = pending_.Track(socket->get());
    if (!pending.ok()) return fail(pending.status());
    if (absl::Status made =
            ConnectSocket(socket->get(), *target, kControlConnectTimeoutMs, &pending_);
        !made.ok()) {
      return fail(pending_.OrCancelled(WithContext(made, context)));
    }
    LinkPtr link;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_)
        return failure = absl::FailedPreconditionError("fabric shutting down");
      if (links_.size() >= kMaxVerbsLinks) {
        return failure = absl::ResourceExhaustedError(
                   absl::StrCat("already ", links_.size(), " control connections"));
      }
      link = NewLink(static_cast<int>(nic), ControlLink::Role::kOutbound,
                     *std::move(socket));
    }
    made.push_back(link);
    absl::Status shaken =
        link->Handshake(options_.node_name, peer_name, *key,
                        static_cast<uint32_t>(options_.qps_per_peer_nic));
    if (!shaken.ok()) return fail(pending_.OrCancelled(WithContext(shaken, context)));
  }
  // Cancelled after the handshakes: their sockets may be shut down already.
  if (absl::Status cancelled = pending_.OrCancelled(absl::OkStatus()); !cancelled.ok()) {
    return failure = cancelled;
  }
  absl::MutexLock lock(&mu_);
  if (shutting_down_)
    return failure = absl::FailedPreconditionError("fabric shutting down");
  const PeerId id = LivePeer(peer_name);
  for (const LinkPtr& link : made) {
    LinkEntry& entry = links_.at(link->id());
    AttachLocked(entry, id);
    link->Start();
  }
  std::move(rollback).Cancel();
  return id;
}

void VerbsFabric::Disconnect(PeerId peer) {
  absl::MutexLock lock(&mu_);
  peers_.Disconnect(peer);
}

std::string VerbsFabric::PeerName(PeerId peer) const {
  absl::ReaderMutexLock lock(&mu_);
  return peers_.Name(peer);
}

void VerbsFabric::OnQpCreated(uint64_t link) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(link);
  if (it == links_.end()) return;
  ++it->second.live_qps;
}

void VerbsFabric::OnQpClosed(uint64_t link_id, VerbsQp* qp, const absl::Status& why) {
  PeerId peer_id = 0;
  std::optional<std::string> lost;
  {
    absl::MutexLock lock(&mu_);
    auto it = links_.find(link_id);
    if (it == links_.end()) return;
    LinkEntry& entry = it->second;
    entry.link->Forget(qp);
    // A source with no QP left on a link gives it up; a target keeps its end while the
    // connection lasts (the source may renew the QP after a refusal).
    if (--entry.live_qps == 0 && entry.link->role() == ControlLink::Role::kOutbound) {
      entry.link->Close(why);
    }
    peer_id = entry.peer;
    lost = LoseIfDone(peer_id);
    MaybeReap(link_id, entry);
  }
  if (lost.has_value()) handler_.OnPeerLost(peer_id, *lost, PeerLostStatus(why));
}

void VerbsFabric::OnQpRefused(uint64_t link_id, std::shared_ptr<VerbsQp> qp) {
  LinkPtr link;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = links_.find(link_id);
    if (it != links_.end()) link = it->second.link;
  }
  if (link == nullptr) return;  // the link is going: its QPs close with it
  worker_.Run([link = std::move(link), qp = std::move(qp)]() mutable {
    link->Renew(std::move(qp));
  });
}

absl::Status VerbsFabric::CheckPeerShare(const ControlLink& link,
                                         absl::string_view name) {
  const std::optional<PeerId> id = peers_.Find(name);
  if (!id.has_value()) return absl::OkStatus();
  const std::vector<LinkPtr>& links = peers_.Get(*id)->links;
  const auto open =
      static_cast<size_t>(std::count_if(links.begin(), links.end(), [](const LinkPtr& l) {
        return l->role() == ControlLink::Role::kInbound && !l->closed();
      }));
  if (open < max_links_per_peer_) return absl::OkStatus();
  link.nic().CountPeerLinkRefusal();
  return WithReason(absl::ResourceExhaustedError(
                        absl::StrCat("peer '", BoundedForMessage(name), "' holds ", open,
                                     " control connections to this node, its share "
                                     "(max_links_per_peer ",
                                     max_links_per_peer_, ")")),
                    reasons::kFabricPeerConnections);
}

absl::Status VerbsFabric::AdmitInbound(uint64_t link, absl::string_view name) {
  absl::ReaderMutexLock lock(&mu_);
  auto it = links_.find(link);
  if (it == links_.end()) return absl::InternalError("unknown link");
  return CheckPeerShare(*it->second.link, name);
}

absl::StatusOr<PeerId> VerbsFabric::AttachInbound(uint64_t link, absl::string_view name) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("fabric shutting down");
  auto it = links_.find(link);
  if (it == links_.end()) return absl::InternalError("unknown link");
  // Checked again: links of the same peer may have passed AdmitInbound together.
  FL_RETURN_IF_ERROR(CheckPeerShare(*it->second.link, name));
  const PeerId id = LivePeer(name);
  AttachLocked(it->second, id);
  return id;
}

void VerbsFabric::OnLinkFinished(uint64_t link) {
  PeerId peer_id = 0;
  std::optional<std::string> lost;
  absl::Status why;
  {
    absl::MutexLock lock(&mu_);
    auto it = links_.find(link);
    if (it == links_.end()) return;
    it->second.finished = true;
    it->second.pushing = false;
    peer_id = it->second.peer;
    why = it->second.link->close_reason();
    lost = LoseIfDone(peer_id);
    MaybeReap(link, it->second);
  }
  if (lost.has_value()) handler_.OnPeerLost(peer_id, *lost, PeerLostStatus(why));
}

void VerbsFabric::MaybeReap(uint64_t id, LinkEntry& entry) {
  if (!entry.alive() && !entry.reaping) {
    entry.reaping = true;
    finished_.push_back(id);
  }
}

void VerbsFabric::OnAccepted(int nic, UniqueFd socket) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;  // drops the client
  // As the TCP fabric: at most handshake::kMaxUnprovenConnections inbound links in their
  // handshake; the oldest goes for the new one.
  size_t unproven = 0;
  LinkEntry* oldest = nullptr;
  for (auto& [id, entry] : links_) {
    if (entry.peer != 0 || entry.finished ||
        entry.link->role() != ControlLink::Role::kInbound) {
      continue;
    }
    ++unproven;
    if (oldest == nullptr) oldest = &entry;
  }
  if (unproven >= handshake::kMaxUnprovenConnections && oldest != nullptr) {
    oldest->link->nic().CountAuthFailure();
    oldest->link->Close(absl::UnavailableError(
        "closed unproven for a newer connection (too many in their handshake)"));
  }
  if (links_.size() >= kMaxVerbsLinks) return;  // drops the client
  NewLink(nic, ControlLink::Role::kInbound, std::move(socket))->Start();
}

void VerbsFabric::Reap() {
  NameThisThread("fl-verbs-reaper");
  while (true) {
    LinkPtr link;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &VerbsFabric::ReaperHasWork));
      if (finished_.empty()) return;  // reaper_stop_
      const uint64_t id = finished_.front();
      finished_.pop_front();
      auto it = links_.find(id);
      link = std::move(it->second.link);
      if (Peer* peer = peers_.Get(it->second.peer)) std::erase(peer->links, link);
      links_.erase(it);
    }
    link->Close(absl::CancelledError("reaped"));
    link->Join();
  }
}

}  // namespace verbs_internal
}  // namespace fuselink::fabric
