#include "agent/peer/notifier.h"

#include <algorithm>

#include "agent/common/check.h"

namespace fuselink::peer {
namespace {

// How long the sender backs off when every NIC's queue to a node is full.
constexpr absl::Duration kFullQueueBackoff = absl::Microseconds(200);

}  // namespace

Notifier::Notifier(fabric::Fabric* fabric, PeerDirectory* peers,
                   bool (*is_idle_mask)(uint32_t))
    : fabric_(fabric), peers_(peers), is_idle_mask_(is_idle_mask) {
  sender_ = std::thread([this] { SendLoop(); });
  connector_ = std::thread([this] { ConnectLoop(); });
}

Notifier::~Notifier() { Stop(); }

void Notifier::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (sender_.joinable()) sender_.join();
  if (connector_.joinable()) connector_.join();
}

uint64_t Notifier::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

size_t Notifier::QueuedLocked() const {
  size_t n = ready_.size();
  for (const auto& [node, imms] : parked_) n += imms.size();
  return n;
}

void Notifier::DropOneLocked() {
  ++dropped_;
  auto mask = std::find_if(ready_.begin(), ready_.end(),
                           [&](const Notice& n) { return is_idle_mask_(n.imm); });
  if (mask != ready_.end()) {
    ready_.erase(mask);
  } else if (!ready_.empty()) {
    ready_.pop_front();
  } else {
    for (auto& [node, imms] : parked_) {
      if (!imms.empty()) {
        imms.pop_front();
        return;
      }
    }
  }
}

void Notifier::Send(const std::string& node, uint32_t imm) {
  absl::MutexLock lock(&mu_);
  if (stop_) return;
  if (QueuedLocked() >= kMaxQueuedNotices) DropOneLocked();
  ready_.push_back(Notice{node, imm});
}

void Notifier::SendLoop() {
  NameThisThread("fl-notify-tx");
  for (;;) {
    Notice notice;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Notifier* n)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return n->stop_ || !n->ready_.empty(); },
          this));
      if (stop_) return;
      notice = std::move(ready_.front());
      ready_.pop_front();
    }
    std::optional<fabric::PeerId> peer = peers_->ConnectedPeer(notice.node);
    bool full = false;
    bool posted = false;
    if (peer.has_value()) {
      fabric::WriteOp op;
      op.imm = notice.imm;
      for (int nic = 0; nic < fabric_->nic_count() && !posted; ++nic) {
        absl::Status s = fabric_->PostWrite(*peer, nic, op);
        posted = s.ok();
        full = full || absl::IsResourceExhausted(s);
      }
    }
    if (posted) continue;
    absl::MutexLock lock(&mu_);
    if (full) {
      // Back-pressure, not failure: the notice waits its turn again.
      ready_.push_front(std::move(notice));
      mu_.AwaitWithTimeout(absl::Condition(&stop_), kFullQueueBackoff);
    } else {
      parked_[notice.node].push_back(notice.imm);
      to_connect_.insert(notice.node);
    }
  }
}

void Notifier::ConnectLoop() {
  NameThisThread("fl-notify-conn");
  for (;;) {
    std::string node;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Notifier* n) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return n->stop_ || !n->to_connect_.empty();
          },
          this));
      if (stop_) return;
      node = *to_connect_.begin();
      to_connect_.erase(to_connect_.begin());
    }
    const bool up = peers_->FabricPeer(node).ok();  // may block for seconds
    absl::MutexLock lock(&mu_);
    auto it = parked_.find(node);
    if (it == parked_.end()) continue;
    if (up) {
      for (uint32_t imm : it->second) ready_.push_back(Notice{node, imm});
    } else {
      dropped_ += it->second.size();  // the source asks over gRPC instead
    }
    parked_.erase(it);
  }
}

}  // namespace fuselink::peer
