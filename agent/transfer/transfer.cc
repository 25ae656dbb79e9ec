#include "agent/transfer/transfer.h"

#include <algorithm>

#include "agent/common/check.h"
#include "agent/common/status_macros.h"

namespace fuselink::transfer {

bool IsTerminal(State s) {
  return s == State::kCompleted || s == State::kFailed || s == State::kCancelled;
}

// A stream's position in the transfer's events. Guarded by the transfer's mu_.
struct Transfer::Subscription {
  EventSink* sink = nullptr;
  bool writing = false;    // a StartWrite is outstanding
  bool finished = false;   // Finish was called
  bool cancelled = false;  // the client went away
  bool accepted_sent = false;
  bool final_sent = false;
  size_t layers_sent = 0;
  uint64_t progress_sent_bytes = 0;
  v1::TransferEvent event;  // the event being written
};

Transfer::Transfer(std::string id, v1::TransferRequest request, std::string fingerprint,
                   std::vector<std::string> nic_names, absl::Time deadline)
    : id_(std::move(id)),
      request_(std::move(request)),
      fingerprint_(std::move(fingerprint)),
      nic_names_(std::move(nic_names)),
      deadline_(deadline) {
  nic_bytes_.assign(nic_names_.size(), 0);  // no other thread sees it yet
}

Transfer::~Transfer() = default;

void Transfer::Accept(uint64_t total_bytes, uint64_t chunks, uint32_t layer_begin,
                      uint32_t layer_count, absl::string_view transport,
                      absl::string_view policy) {
  {
    absl::MutexLock lock(&mu_);
    AcceptLocked(total_bytes, chunks, layer_begin, layer_count, transport, policy);
  }
  Notify(false, absl::ZeroDuration());
}

void Transfer::AcceptLocked(uint64_t total_bytes, uint64_t chunks, uint32_t layer_begin,
                            uint32_t layer_count, absl::string_view transport,
                            absl::string_view policy) {
  total_bytes_ = total_bytes;
  chunks_ = chunks;
  layer_begin_ = layer_begin;
  layer_left_bytes_.assign(layer_count, total_bytes / layer_count);
  layers_done_.reserve(layer_count);
  transport_ = std::string(transport);
  policy_ = std::string(policy);
  accepted_ = true;
  started_ = absl::Now();
  if (state_ == State::kPreparing) state_ = State::kRunning;
}

bool Transfer::AddDone(int nic, uint32_t layer, uint64_t bytes) {
  FL_CHECK(nic >= 0 && static_cast<size_t>(nic) < nic_bytes_.size(),
           "bytes done on a NIC the transfer does not have");
  FL_CHECK(layer >= layer_begin_ && layer - layer_begin_ < layer_left_bytes_.size(),
           "bytes done in a layer the transfer does not move");
  bytes_done_ += bytes;
  FL_EXPECT(bytes_done_ <= total_bytes_, "a transfer counted more bytes than it moves");
  nic_bytes_[nic] += bytes;
  uint64_t& left = layer_left_bytes_[layer - layer_begin_];
  if (left == 0) return false;  // a layer is done once
  left -= std::min(left, bytes);
  if (left != 0) return false;
  layers_done_.push_back(layer);
  return true;
}

void Transfer::SetState(State state, absl::Status status) {
  state_ = state;
  if (!status.ok() && failure_.ok()) failure_ = std::move(status);
  if (IsTerminal(state)) finished_ = absl::Now();
}

absl::Duration Transfer::elapsed_locked() const {
  const absl::Time end = IsTerminal(state_) ? finished_ : absl::Now();
  return accepted_ ? end - started_ : absl::ZeroDuration();
}

absl::Time Transfer::finished_at() const {
  absl::MutexLock lock(&mu_);
  return IsTerminal(state_) ? finished_ : absl::InfiniteFuture();
}

State Transfer::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

void Transfer::Subscribe(EventSink* sink, Subscription** handle) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    subs_.push_back(std::make_unique<Subscription>());
    *handle = subs_.back().get();
    (*handle)->sink = sink;
    Advance(*handle, &actions);
  }
  Run(actions);
}

void Transfer::OnWriteDone(Subscription* sub, bool ok) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    sub->writing = false;
    if (!ok) sub->cancelled = true;
    Advance(sub, &actions);
  }
  Run(actions);
}

void Transfer::OnStreamCancelled(Subscription* sub) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    sub->cancelled = true;
    Advance(sub, &actions);
  }
  Run(actions);
}

void Transfer::Unsubscribe(Subscription* sub) {
  absl::MutexLock lock(&mu_);
  auto it = std::find_if(subs_.begin(), subs_.end(),
                         [sub](const auto& s) { return s.get() == sub; });
  if (it != subs_.end()) subs_.erase(it);
}

void Transfer::Notify(bool progress_only, absl::Duration progress_interval) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (progress_only && now - last_progress_notify_ < progress_interval) return;
    last_progress_notify_ = now;
    for (auto& sub : subs_) Advance(sub.get(), &actions);
  }
  Run(actions);
}

void Transfer::Run(const Actions& actions) {
  for (const Action& a : actions) {
    if (a.event != nullptr) {
      a.sink->SendEvent(a.event);
    } else {
      a.sink->End(a.status);
    }
  }
}

absl::Status Transfer::FinalStatus() const {
  if (state_ == State::kCompleted) return absl::OkStatus();
  if (!failure_.ok()) return failure_;
  return absl::CancelledError("transfer cancelled");
}

void Transfer::FillProgress(v1::Progress* progress) const {
  progress->set_bytes_done(bytes_done_);
  progress->set_total_bytes(total_bytes_);
  for (size_t i = 0; i < nic_names_.size(); ++i) {
    v1::NicBytes* nb = progress->add_per_nic();
    nb->set_nic(nic_names_[i]);
    nb->set_bytes(nic_bytes_[i]);
  }
}

void Transfer::Advance(Subscription* sub, Actions* actions) {
  if (sub->writing || sub->finished) return;
  auto finish = [&](absl::Status status) {
    sub->finished = true;
    actions->push_back(Action{sub->sink, nullptr, std::move(status)});
  };
  if (sub->cancelled) return finish(absl::CancelledError("stream cancelled"));
  const bool terminal = EndHeard();
  if (!accepted_) {
    // Failed before the target accepted: the call itself fails, with no events.
    if (terminal) finish(FinalStatus());
    return;
  }
  v1::TransferEvent& e = sub->event;
  e.Clear();
  e.set_transfer_id(id_);
  if (!sub->accepted_sent) {
    sub->accepted_sent = true;
    v1::Accepted* a = e.mutable_accepted();
    a->set_total_bytes(total_bytes_);
    a->set_chunks(chunks_);
    a->set_transport(transport_);
    a->set_policy(policy_);
  } else if (sub->layers_sent < layers_done_.size()) {
    e.mutable_layer_done()->set_layer(layers_done_[sub->layers_sent++]);
  } else if (!terminal && sub->progress_sent_bytes != bytes_done_) {
    sub->progress_sent_bytes = bytes_done_;
    FillProgress(e.mutable_progress());
  } else if (terminal && !sub->final_sent) {
    sub->final_sent = true;
    if (state_ == State::kCompleted) {
      v1::Completed* c = e.mutable_completed();
      c->set_total_bytes(total_bytes_);
      c->set_seconds(absl::ToDoubleSeconds(finished_ - started_));
      v1::Progress p;
      FillProgress(&p);
      *c->mutable_per_nic() = std::move(*p.mutable_per_nic());
    } else {
      const absl::Status status = FinalStatus();
      v1::Failed* f = e.mutable_failed();
      f->set_code(static_cast<int>(status.code()));
      f->set_message(std::string(status.message()));
      f->set_reason(ReasonOf(status));
    }
  } else {
    if (sub->final_sent) finish(FinalStatus());
    return;
  }
  sub->writing = true;
  actions->push_back(Action{sub->sink, &e, absl::OkStatus()});
}

void Transfer::ReleaseEnd() {
  absl::MutexLock lock(&mu_);
  end_held_ = false;
}

v1::TransferStatus Transfer::Status() const {
  v1::TransferStatus out;
  out.set_transfer_id(id_);
  out.set_request_id(request_.request_id());
  *out.mutable_request() = request_;
  absl::MutexLock lock(&mu_);
  switch (EndHeard() ? state_ : State::kRunning) {
    case State::kPreparing:
    case State::kRunning:
    case State::kStopping:
      out.set_state(v1::TRANSFER_STATE_RUNNING);
      break;
    case State::kCompleted:
      out.set_state(v1::TRANSFER_STATE_COMPLETED);
      break;
    case State::kFailed:
      out.set_state(v1::TRANSFER_STATE_FAILED);
      break;
    case State::kCancelled:
      out.set_state(v1::TRANSFER_STATE_CANCELLED);
      break;
  }
  FillProgress(out.mutable_progress());
  if (!failure_.ok()) {
    v1::Failed* f = out.mutable_failure();
    f->set_code(static_cast<int>(failure_.code()));
    f->set_message(std::string(failure_.message()));
    f->set_reason(ReasonOf(failure_));
  }
  return out;
}

}  // namespace fuselink::transfer
