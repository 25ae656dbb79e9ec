// The source's transfers by id and by request id: admission against the bound on
// transfers in flight, idempotency on request id, the live jobs (which completions,
// verdicts, idle-NIC notices and shutdown reach), and the finished transfers kept for
// GetTransfer and retries, forgotten oldest first.
//
// Request ids: a request id names one transfer while that transfer runs, and after
// it ends while it is kept — the same content gets that transfer again, other content
// is ALREADY_EXISTS — except when it ended with a failure the caller is told to
// retry (UNAVAILABLE, ABORTED) or before the target accepted it: then the same id
// starts a new attempt, whatever its content.
//
// Thread-safe. A leaf lock: taken under a transfer's lock, never the other way.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/job.h"

namespace fuselink::transfer {

struct RegistryOptions {
  // Transfers preparing or running at once.
  size_t max_active = 64;
  // Of them, one requester's (a router; "" under open access): its share, so that one
  // router cannot take every slot. At or over max_active, only max_active bounds it.
  size_t max_active_per_requester = 32;
  // Finished transfers kept for GetTransfer and idempotent retries.
  size_t max_finished_kept = 4096;
  absl::Duration finished_kept_for = absl::Minutes(10);
};

class TransferRegistry {
 public:
  using JobPtr = std::shared_ptr<Job>;
  // Builds a job: `serial` names it in wr_ids, `number` makes its transfer id.
  using MakeJob = absl::FunctionRef<JobPtr(uint32_t serial, uint64_t number)>;

  explicit TransferRegistry(RegistryOptions options) : options_(options) {}

  // What a request id names is the requester's own: two requesters' equal ids are
  // two keys. Existing, Admit and Find take this key.
  static std::string RequestKey(absl::string_view requester,
                                absl::string_view request_id);

  // The transfer `request_id` names now: one with `fingerprint`, or ALREADY_EXISTS
  // (REQUEST_ID_REUSED) for another; null when the id names none (or a freed one).
  absl::StatusOr<JobPtr> Existing(const std::string& request_id,
                                  absl::string_view fingerprint) const;
  // As Existing, and when the id names none, admits the job `make` builds (under the
  // registry's lock: `make` locks nothing). `fingerprint` is not read once `make` has
  // been called (make may take the string it views). `*fresh` says which.
  // RESOURCE_EXHAUSTED (TOO_MANY_TRANSFERS) past max_active, (TRANSFER_SHARE, counted)
  // past `requester`'s max_active_per_requester; UNAVAILABLE (SHUTTING_DOWN) once
  // closed. The job `make` builds must be `requester`'s (Job::requester).
  absl::StatusOr<JobPtr> Admit(const std::string& request_id,
                               absl::string_view fingerprint, MakeJob make, bool* fresh,
                               absl::string_view requester = "");

  // A live job by its serial (from a wr_id); null when none.
  JobPtr FindLive(uint32_t serial) const;
  // Live or kept, by transfer id, else by request id. NOT_FOUND (UNKNOWN_TRANSFER).
  absl::StatusOr<JobPtr> Find(absl::string_view transfer_id,
                              absl::string_view request_id) const;
  std::vector<JobPtr> Live() const;

  // The target `target_node`, in its incarnation `incarnation`
  // (Prepared::incarnation), accepted `job` into `slot` (SlotId packed): its verdict
  // notices find it by that. The node's incarnation heard last becomes its current
  // one.
  void Accepted(const JobPtr& job, const std::string& target_node, uint32_t slot,
                uint64_t incarnation = 0);
  // The live job a verdict notice from `target_node` names; null when none. A notice
  // carries no incarnation: it names only jobs of the node's current one, as a
  // target that restarted reuses slots and generations from the start, and its
  // notices must not end a transfer its previous incarnation accepted (that one
  // learns its end from QueryVerdict).
  JobPtr FindByVerdict(absl::string_view target_node, const VerdictNotice& notice) const;

  // `job` ended at `now`; with `free_request_id` its request id may start anew.
  void Finished(const JobPtr& job, bool free_request_id, absl::Time now);
  // Forgets the finished transfers kept past finished_kept_for, and the oldest past
  // max_finished_kept. Costs only what it forgets.
  void Collect(absl::Time now);
  // Admits nothing more. False when it was closed already.
  bool Close();

  size_t active() const;
  size_t kept() const;
  // Admissions refused TRANSFER_SHARE.
  uint64_t share_refusals() const;

 private:
  struct Request {
    JobPtr job;
    bool free = false;  // a new attempt may take the id
  };
  absl::StatusOr<JobPtr> ExistingLocked(const std::string& request_id,
                                        absl::string_view fingerprint) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint32_t NextSerialLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RegistryOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, JobPtr> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Request> by_request_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, JobPtr> live_ ABSL_GUARDED_BY(mu_);
  // Live accepted jobs of each target node, with their slots and the incarnation
  // that accepted them, and the node's current incarnation (heard last).
  struct AcceptedJob {
    uint32_t slot = 0;
    uint64_t incarnation = 0;
    JobPtr job;
  };
  struct Target {
    uint64_t incarnation = 0;
    std::vector<AcceptedJob> jobs;
  };
  absl::flat_hash_map<std::string, Target> by_target_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<absl::Time, JobPtr>> finished_ ABSL_GUARDED_BY(mu_);  // in order
  uint32_t next_serial_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_number_ ABSL_GUARDED_BY(mu_) = 1;
  size_t active_ ABSL_GUARDED_BY(mu_) = 0;
  // Live jobs by requester; a requester with none has no entry.
  absl::flat_hash_map<std::string, size_t> active_by_requester_ ABSL_GUARDED_BY(mu_);
  uint64_t share_refusals_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace fuselink::transfer
