// The CUDA IPC handles this agent has open, each held for one owner only. A handle
// opens only once per process, and an engine lends several tensors of one allocation
// (PyTorch's caching allocator cuts small per-layer tensors from one segment): its
// second region reuses its first's import instead of failing. Another owner naming
// the same handle gets nothing of it: PERMISSION_DENIED (GPU_HANDLE_OWNED), so that
// no engine reaches memory another lent, nor keeps it mapped after its owner lets go.
// The import closes when the owner's last region lets go of it.
//
// SharedImports holds the decisions (who shares, who is refused, how long a closing
// import is waited for) over any import type, so that they are tested without a GPU;
// IpcImports is it over the driver's CUDA IPC imports. Thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/common/stats.h"
#include "agent/common/status_macros.h"
#include "agent/gpu/ipc.h"

namespace fuselink::services {

// How long an Open waits for the same handle's closing import (its owner's last
// region just let go, and the driver is closing it) before UNAVAILABLE
// (GPU_HANDLE_CLOSING): the default of --ipc_close_wait_ms. Closing unmaps the
// allocation; it does not wait on the GPU's work, so this is generous.
inline constexpr absl::Duration kIpcCloseWait = absl::Seconds(5);
// The longest such wait the node takes: a registration blocks its caller that long.
inline constexpr absl::Duration kMaxIpcCloseWait = absl::Seconds(60);

// Who lent an import: the registering caller's identity (empty under --plaintext)
// and the pid of the process that passed the owner pidfd over the handle socket (as
// SO_PEERCRED read it; 0 when not visible in the agent's pid namespace).
struct ImportOwner {
  std::string identity;
  pid_t pid = 0;
  friend bool operator==(const ImportOwner&, const ImportOwner&) = default;
};

// Counts of refusals, read by the metrics.
struct ImportRefusals {
  uint64_t owned = 0;           // GPU_HANDLE_OWNED
  uint64_t closing = 0;         // GPU_HANDLE_CLOSING: kIpcCloseWait passed
  uint64_t no_owner_token = 0;  // OWNER_TOKEN_REQUIRED (IpcImports::CountNoOwnerToken)
};

template <typename Import>
class SharedImports {
 public:
  using Key = std::pair<int, std::string>;  // GPU, handle bytes
  using Opener = absl::FunctionRef<absl::StatusOr<std::unique_ptr<Import>>()>;

  explicit SharedImports(absl::Duration close_wait = kIpcCloseWait)
      : state_(std::make_shared<State>()), close_wait_(close_wait) {}

  // `owner`'s import of `key`: the one it holds already, else `open()`'s, kept while
  // any of the returned pointers lives. PERMISSION_DENIED (GPU_HANDLE_OWNED) while
  // another owner holds `key`; an import being closed is waited for (at most the
  // close wait, then UNAVAILABLE, GPU_HANDLE_CLOSING) and then opened anew. Whatever
  // `open` fails with comes back as is. Blocks: `open` runs under the lock.
  absl::StatusOr<std::shared_ptr<const Import>> Open(const Key& key,
                                                     const ImportOwner& owner,
                                                     Opener open) {
    State& s = *state_;
    const absl::Time deadline = absl::Now() + close_wait_;
    absl::MutexLock lock(&s.mu);
    for (;;) {
      auto it = s.open.find(key);
      if (it == s.open.end()) break;
      const Entry& entry = it->second;
      // Another's import is never held here, not even for a moment: its last holder
      // may let go meanwhile, and its deleter takes this lock.
      if (!(entry.owner == owner) && !entry.import.expired()) {
        ++s.refusals.owned;
        return WithReason(absl::PermissionDeniedError(absl::StrCat(
                              "another owner has lent this CUDA IPC handle on GPU ",
                              key.first, "; an import is never shared")),
                          reasons::kGpuHandleOwned);
      }
      if (entry.owner == owner) {
        if (std::shared_ptr<const Import> held = entry.import.lock()) return held;
      }
      // Its last holder let go and its deleter is closing it: wait for that.
      if (absl::Now() >= deadline) {
        ++s.refusals.closing;
        return WithReason(absl::UnavailableError(absl::StrCat(
                              "this CUDA IPC handle is still being closed after ",
                              absl::FormatDuration(close_wait_), "; retry")),
                          reasons::kGpuHandleClosing);
      }
      s.closed.WaitWithDeadline(&s.mu, deadline);
    }
    absl::StatusOr<std::unique_ptr<Import>> opened = open();
    if (!opened.ok()) return opened.status();
    std::shared_ptr<const Import> held(
        opened->release(),
        [state = state_, key](const Import* import) { Close(*state, key, import); });
    s.open[key] = Entry{owner, held};
    return held;
  }

  ImportRefusals refusals() const {
    absl::MutexLock lock(&state_->mu);
    return state_->refusals;
  }

 private:
  struct State;
  // The deleter: closes `import` outside the lock (other handles open meanwhile),
  // then forgets its entry, so that Open never finds the entry gone while the driver
  // still holds the handle open. Runs on whichever thread let go last.
  static void Close(State& state, const Key& key, const Import* import) {
    delete import;
    absl::MutexLock lock(&state.mu);
    state.open.erase(key);
    state.closed.SignalAll();
  }

  struct Entry {
    ImportOwner owner;
    std::weak_ptr<const Import> import;
  };
  // Shared with the imports' deleters, which may outlive this object.
  struct State {
    absl::Mutex mu;
    absl::CondVar closed;  // signalled when an entry is erased
    // An entry lives from its open until its import is closed (by its deleter).
    std::map<Key, Entry> open ABSL_GUARDED_BY(mu);
    ImportRefusals refusals ABSL_GUARDED_BY(mu);
  };
  const std::shared_ptr<State> state_;
  const absl::Duration close_wait_;
};

class IpcImports {
 public:
  explicit IpcImports(absl::Duration close_wait = kIpcCloseWait) : imports_(close_wait) {}

  // `owner`'s import of the allocation `handle` names on `gpu` (SharedImports::Open);
  // the driver's refusal as gpu::IpcImport::Open says.
  absl::StatusOr<std::shared_ptr<const gpu::IpcImport>> Open(
      int gpu, const gpu::PrimaryContext& context, const gpu::IpcMemHandle& handle,
      const ImportOwner& owner);

  // A handle offered without an owner token (OWNER_TOKEN_REQUIRED), refused by the
  // caller before it reached this table.
  void CountNoOwnerToken() { no_owner_token_.fetch_add(1, std::memory_order_relaxed); }

  ImportRefusals refusals() const {
    ImportRefusals r = imports_.refusals();
    r.no_owner_token = no_owner_token_.load(std::memory_order_relaxed);
    return r;
  }

  // CUDA IPC handles refused, by reason.
  void ReportStats(stats::Sink& sink) const;

 private:
  SharedImports<gpu::IpcImport> imports_;
  std::atomic<uint64_t> no_owner_token_{0};
};

}  // namespace fuselink::services
