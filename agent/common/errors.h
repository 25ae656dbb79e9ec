// The catalogue of error reasons: every machine-readable reason the agent attaches to
// an error, with the gRPC code it comes with and one line of what it means. A reason
// travels to clients as google.rpc.ErrorInfo.reason (grpc_status.h); clients branch on
// it, so a name, once shipped, never changes.
//
// Code names a reason by its constant, never by text:
//
//   return WithReason(absl::NotFoundError("no tensor named 'kv'"),
//                     reasons::kUnknownTensor);
//
// so that a typo does not compile and every reason is here. The one exception is a
// reason the agent passes on without making it (a peer's, a CUDA error's name):
// WithForeignReason (status_macros.h).
//
// To add a reason: one line of FUSELINK_REASONS below (kept in alphabetical order of
// the name on the wire), then regenerate docs/errors.md and the Python client's
// fuselink/reasons.py with `ninja -C build errors_docs` (errors_catalogue_test fails
// until they match).
#pragma once

#include <array>
#include <cstddef>
#include <iosfwd>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace fuselink {

// One reason. `code` is the code it comes with (a call site may pick another where
// the caller's remedy differs, e.g. LOCAL_COPY); `meaning` is one line for the docs.
struct Reason {
  absl::string_view name;  // UPPER_SNAKE_CASE, as on the wire; "_*" ends a family
  absl::StatusCode code;
  absl::string_view meaning;

  // The name on the wire against a received reason (ReasonOf's).
  friend constexpr bool operator==(const Reason& reason, absl::string_view name) {
    return reason.name == name;
  }
};
std::ostream& operator<<(std::ostream& os, const Reason& reason);

// X(constant, name on the wire, code, meaning). The constant is the name in
// CamelCase after a k (checked below); a family's constant leaves out the "_*".
#define FUSELINK_REASONS(X)                                                              \
  X(kAliasedRegions, "ALIASED_REGIONS", kInvalidArgument,                                \
    "Two regions of one tensor are the same memory (one file or allocation lent "        \
    "twice).")                                                                           \
  X(kAliasedTensors, "ALIASED_TENSORS", kInvalidArgument,                                \
    "Source and target tensors share memory: the move would overwrite what it reads.")   \
  X(kBadDeadline, "BAD_DEADLINE", kInvalidArgument,                                      \
    "The request's deadline is not a valid timestamp.")                                  \
  X(kBadFdToken, "BAD_FD_TOKEN", kInvalidArgument,                                       \
    "fd_token is unknown, used or expired: pass the descriptor over the handle socket "  \
    "first.")                                                                            \
  X(kBadGpuHandle, "BAD_GPU_HANDLE", kInvalidArgument,                                   \
    "A CUDA IPC handle the driver refused, or one of the wrong size.")                   \
  X(kBadGrant, "BAD_GRANT", kInvalidArgument,                                            \
    "A tensor's readers or writers name no valid identity or role.")                     \
  X(kBadHomeGpu, "BAD_HOME_GPU", kInvalidArgument,                                       \
    "The GPU named for a tensor does not exist on this node.")                           \
  X(kBadLayout, "BAD_LAYOUT", kInvalidArgument,                                          \
    "A tensor's layout is inconsistent or over its bounds.")                             \
  X(kBadLease, "BAD_LEASE", kInvalidArgument, "lease_ms is over its bound.")             \
  X(kBadMemory, "BAD_MEMORY", kInvalidArgument,                                          \
    "The memory lent for a tensor is empty, misaligned or not what its kind says.")      \
  X(kBadName, "BAD_NAME", kInvalidArgument,                                              \
    "A tensor name is empty, too long or has characters outside [A-Za-z0-9._/-].")       \
  X(kBadOwnerFd, "BAD_OWNER_FD", kInvalidArgument,                                       \
    "owner_fd_token names a descriptor that is not a pidfd of the lending process.")     \
  X(kBadPolicy, "BAD_POLICY", kInvalidArgument,                                          \
    "The access policy file does not parse or names unknown roles.")                     \
  X(kBadRelayMode, "BAD_RELAY_MODE", kInvalidArgument,                                   \
    "A GPU relay stage is neither d1 (kernel) nor d2 (copy engine).")                    \
  X(kBadRequestId, "BAD_REQUEST_ID", kInvalidArgument,                                   \
    "request_id is empty or longer than its bound.")                                     \
  X(kBadSocketPath, "BAD_SOCKET_PATH", kInvalidArgument,                                 \
    "The node name cannot make a handle socket path: give --handle_socket.")             \
  X(kBadSourceNic, "BAD_SOURCE_NIC", kInvalidArgument,                                   \
    "A peer named a source NIC that is not one of the rails.")                           \
  X(kBadTlsFiles, "BAD_TLS_FILES", kInvalidArgument,                                     \
    "A TLS certificate, key or CA file is missing or does not parse.")                   \
  X(kBadTopology, "BAD_TOPOLOGY", kInvalidArgument,                                      \
    "The topology (--topology file or a peer's) is inconsistent.")                       \
  X(kBadTotal, "BAD_TOTAL", kInvalidArgument,                                            \
    "A peer's total_bytes disagrees with the blocks it asked for.")                      \
  X(kBadTransport, "BAD_TRANSPORT", kInvalidArgument,                                    \
    "--transport is not auto, tcp or verbs.")                                            \
  X(kBadUtf8, "BAD_UTF8", kInvalidArgument,                                              \
    "A string field of the request is not valid UTF-8.")                                 \
  X(kBlockCountMismatch, "BLOCK_COUNT_MISMATCH", kInvalidArgument,                       \
    "Source and target list different numbers of blocks.")                               \
  X(kBlockOutOfRange, "BLOCK_OUT_OF_RANGE", kOutOfRange,                                 \
    "A block id is past the tensor's blocks per layer.")                                 \
  X(kBlockSizeMismatch, "BLOCK_SIZE_MISMATCH", kInvalidArgument,                         \
    "Source and target blocks have different sizes.")                                    \
  X(kCancelled, "CANCELLED", kCancelled, "The transfer was cancelled (CancelTransfer).") \
  X(kCounterRead, "COUNTER_READ", kUnavailable,                                          \
    "A NIC's kernel counter could not be read; the next read may succeed.")              \
  X(kCudaDriverTooOld, "CUDA_DRIVER_TOO_OLD", kFailedPrecondition,                       \
    "The NVIDIA driver lacks an entry point fuselink needs: update it.")                 \
  X(kCudaError, "CUDA_ERROR_*", kInternal,                                               \
    "A CUDA driver call failed; the reason is CUDA's own name for the error and the "    \
    "code follows from it.")                                                             \
  X(kCudaVisibleDevices, "CUDA_VISIBLE_DEVICES", kFailedPrecondition,                    \
    "CUDA_VISIBLE_DEVICES does not parse or names GPUs that are not there.")             \
  X(kDeadline, "DEADLINE", kDeadlineExceeded, "The transfer's deadline passed.")         \
  X(kDuplicateTargetBlock, "DUPLICATE_TARGET_BLOCK", kInvalidArgument,                   \
    "A target block is listed twice: two writes would race for it.")                     \
  X(kEmptyRequest, "EMPTY_REQUEST", kInvalidArgument, "A transfer lists no blocks.")     \
  X(kFabricAckTimeout, "FABRIC_ACK_TIMEOUT", kDeadlineExceeded,                          \
    "A fabric connection (TCP) or QP (verbs) closed: the target acknowledged no write "  \
    "for too long.")                                                                     \
  X(kFabricAuth, "FABRIC_AUTH", kUnauthenticated,                                        \
    "A fabric connection's handshake did not prove the fabric key of the pair of "       \
    "nodes.")                                                                            \
  X(kFabricMalformed, "FABRIC_MALFORMED", kInvalidArgument,                              \
    "A fabric connection closed on a frame that does not decode.")                       \
  X(kFabricNoKey, "FABRIC_NO_KEY", kFailedPrecondition,                                  \
    "No fabric key for the peer yet: the peer bootstrap has not introduced it.")         \
  X(kFabricPeerConnections, "FABRIC_PEER_CONNECTIONS", kResourceExhausted,               \
    "A peer holds its share of fabric connections to this node.")                        \
  X(kFabricStall, "FABRIC_STALL", kDeadlineExceeded,                                     \
    "A fabric connection (TCP, or a verbs control connection) closed: the peer "         \
    "stopped mid-frame for too long.")                                                   \
  X(kForwardingOff, "FORWARDING_OFF", kPermissionDenied,                                 \
    "The source's agent runs no forwarded transfers (--accept_forwarded): ask it "       \
    "directly.")                                                                         \
  X(kGetifaddrs, "GETIFADDRS", kUnavailable,                                             \
    "getifaddrs failed listing the interfaces.")                                         \
  X(kGpuCopyTimeout, "GPU_COPY_TIMEOUT", kDeadlineExceeded,                              \
    "A GPU copy did not finish within --gpu_copy_timeout_ms: the GPU is likely hung. "   \
    "The write fails over; the memory the copy touches stays out of use until it "       \
    "ends.")                                                                             \
  X(kGpuHandleClosing, "GPU_HANDLE_CLOSING", kUnavailable,                               \
    "This CUDA IPC handle is still being closed after an unregister: retry.")            \
  X(kGpuHandleOwned, "GPU_HANDLE_OWNED", kPermissionDenied,                              \
    "Another owner has lent this CUDA IPC handle; an import is never shared.")           \
  X(kIdsDisagree, "IDS_DISAGREE", kInvalidArgument,                                      \
    "transfer_id and request_id name different transfers.")                              \
  X(kIncomingPreparesBusy, "INCOMING_PREPARES_BUSY", kResourceExhausted,                 \
    "The target has as many PrepareIncoming calls from this node queued as it takes.")   \
  X(kIncompleteCommit, "INCOMPLETE_COMMIT", kDataLoss,                                   \
    "The source committed before every byte of the prepared blocks landed.")             \
  X(kLayerOutOfRange, "LAYER_OUT_OF_RANGE", kOutOfRange,                                 \
    "A layer range is empty or past the tensor's or transfer's layers.")                 \
  X(kLayoutExceedsMemory, "LAYOUT_EXCEEDS_MEMORY", kInvalidArgument,                     \
    "The layout needs more bytes than the memory lent.")                                 \
  X(kLayoutPartShare, "LAYOUT_PART_SHARE", kResourceExhausted,                           \
    "The caller holds its share of layout parts (--max_layout_parts_per_engine).")       \
  X(kLeaseExpired, "LEASE_EXPIRED", kDeadlineExceeded,                                   \
    "The transfer's lease ran out: nobody renewed it (ExtendLease).")                    \
  X(kLinkLocalAddress, "LINK_LOCAL_ADDRESS", kInvalidArgument,                           \
    "A NIC's address is IPv6 link-local, which is not routed between nodes.")            \
  X(kLocalCopy, "LOCAL_COPY", kInternal, "An in-node copy failed or cannot be made.")    \
  X(kLocalTarget, "LOCAL_TARGET", kUnimplemented,                                        \
    "Source and target are the same node and in-node moves are off.")                    \
  X(kMalformedRequest, "MALFORMED_REQUEST", kInvalidArgument,                            \
    "The request message is missing or does not parse.")                                 \
  X(kMigUnsupported, "MIG_UNSUPPORTED", kFailedPrecondition,                             \
    "CUDA_VISIBLE_DEVICES names a MIG instance; fuselink needs whole GPUs.")             \
  X(kMissingId, "MISSING_ID", kInvalidArgument,                                          \
    "Neither transfer_id nor request_id is given.")                                      \
  X(kNoClientCertificate, "NO_CLIENT_CERTIFICATE", kUnauthenticated,                     \
    "The caller showed no client certificate of the agent's CA.")                        \
  X(kNoCounters, "NO_COUNTERS", kNotFound,                                               \
    "A NIC has no kernel byte counters to watch.")                                       \
  X(kNoCudaDriver, "NO_CUDA_DRIVER", kFailedPrecondition,                                \
    "No NVIDIA driver (libcuda) on this node.")                                          \
  X(kNoDataNic, "NO_DATA_NIC", kFailedPrecondition,                                      \
    "Topology discovery found no NIC that can carry data.")                              \
  X(kNoDmabuf, "NO_DMABUF", kUnimplemented, "The GPU cannot export dma-bufs.")           \
  X(kNoDmabufExport, "NO_DMABUF_EXPORT", kUnimplemented,                                 \
    "The NVIDIA driver lacks dma-buf export (cuMemGetHandleForAddressRange).")           \
  X(kNoGpu, "NO_GPU", kFailedPrecondition,                                               \
    "The GPU named is not a CUDA device of this agent.")                                 \
  X(kNoIdentity, "NO_IDENTITY", kUnauthenticated,                                        \
    "The client certificate names no SPIFFE ID.")                                        \
  X(kNoLease, "NO_LEASE", kFailedPrecondition,                                           \
    "The transfer was started without a lease.")                                         \
  X(kNoNetdev, "NO_NETDEV", kNotFound,                                                   \
    "No interface in this network namespace holds the NIC's address.")                   \
  X(kNoPeerAccess, "NO_PEER_ACCESS", kFailedPrecondition,                                \
    "One GPU cannot access another as a peer (no NVLink or PCIe P2P path).")             \
  X(kNoRdmaPort, "NO_RDMA_PORT", kNotFound, "No RDMA port belongs to the NIC's netdev.") \
  X(kNoVerdict, "NO_VERDICT", kUnavailable,                                              \
    "The target gave no verdict: the transfer may or may not have landed.")              \
  X(kNodeMismatch, "NODE_MISMATCH", kPermissionDenied,                                   \
    "A peer spoke for a node its certificate does not name.")                            \
  X(kNotLayerByLayer, "NOT_LAYER_BY_LAYER", kFailedPrecondition,                         \
    "MarkLayersReady on a transfer not started layer by layer.")                         \
  X(kNotOwner, "NOT_OWNER", kPermissionDenied, "The tensor belongs to another caller.")  \
  X(kOutsideWindow, "OUTSIDE_WINDOW", kOutOfRange,                                       \
    "A write lies outside the blocks the target prepared.")                              \
  X(kOwnerExited, "OWNER_EXITED", kFailedPrecondition,                                   \
    "The process that lent the tensor exited.")                                          \
  X(kOwnerTokenRequired, "OWNER_TOKEN_REQUIRED", kPermissionDenied,                      \
    "cuda_ipc memory needs owner_fd_token, a pidfd of the lending process.")             \
  X(kPeerLost, "PEER_LOST", kUnavailable, "Every NIC to the peer failed mid-transfer.")  \
  X(kPeerMismatch, "PEER_MISMATCH", kFailedPrecondition,                                 \
    "The agent at a peer's address calls itself by another name.")                       \
  X(kPeerUnreachable, "PEER_UNREACHABLE", kUnavailable,                                  \
    "The peer's agent cannot be reached.")                                               \
  X(kPrepareQueueFull, "PREPARE_QUEUE_FULL", kResourceExhausted,                         \
    "The source has as many prepares for this target queued as it takes.")               \
  X(kProtocol, "PROTOCOL", kInvalidArgument, "A peer broke the transfer protocol.")      \
  X(kQueueFull, "QUEUE_FULL", kResourceExhausted, "A worker pool's queue is full.")      \
  X(kRailMismatch, "RAIL_MISMATCH", kFailedPrecondition,                                 \
    "Two nodes' rails differ: the fabric pairs NIC i with NIC i.")                       \
  X(kRangeOutsideAllocation, "RANGE_OUTSIDE_ALLOCATION", kOutOfRange,                    \
    "A CUDA IPC range leaves the exported allocation.")                                  \
  X(kRefused, "REFUSED", kInternal,                                                      \
    "The target refused a write for no reason it names.")                                \
  X(kRegistrationsBusy, "REGISTRATIONS_BUSY", kResourceExhausted,                        \
    "The caller has as many RegisterTensor calls queued as the agent takes.")            \
  X(kRelayFailed, "RELAY_FAILED", kInternal, "A GPU relay stage failed.")                \
  X(kRequestIdReused, "REQUEST_ID_REUSED", kAlreadyExists,                               \
    "request_id was used already for a transfer with other content.")                    \
  X(kRoleRequired, "ROLE_REQUIRED", kPermissionDenied,                                   \
    "The caller holds no role that allows the call.")                                    \
  X(kRuntimeDirUnsafe, "RUNTIME_DIR_UNSAFE", kFailedPrecondition,                        \
    "The handle socket's directory or path is not safe to use.")                         \
  X(kSameBlocks, "SAME_BLOCKS", kInvalidArgument, "A block is both source and target.")  \
  X(kShuttingDown, "SHUTTING_DOWN", kUnavailable, "The agent is shutting down.")         \
  X(kSourceAborted, "SOURCE_ABORTED", kAborted, "The source stopped the transfer.")      \
  X(kSourceIdle, "SOURCE_IDLE", kUnavailable,                                            \
    "The target heard nothing from the source for too long.")                            \
  X(kSourceNotLocal, "SOURCE_NOT_LOCAL", kFailedPrecondition,                            \
    "The source tensor is on another node: ask that node's agent.")                      \
  X(kSourceShare, "SOURCE_SHARE", kResourceExhausted,                                    \
    "The source node holds its share of the target's incoming slots.")                   \
  X(kTargetFailed, "TARGET_FAILED", kInternal,                                           \
    "The target failed the transfer for a reason it did not name.")                      \
  X(kTargetProtocol, "TARGET_PROTOCOL", kInternal,                                       \
    "The target's answer broke the transfer protocol.")                                  \
  X(kTensorAccess, "TENSOR_ACCESS", kPermissionDenied,                                   \
    "The caller is not granted the tensor it moves.")                                    \
  X(kTensorExists, "TENSOR_EXISTS", kAlreadyExists,                                      \
    "A tensor of that name is registered already.")                                      \
  X(kTensorInUse, "TENSOR_IN_USE", kFailedPrecondition,                                  \
    "The tensor is in use by a transfer: cancel it or wait.")                            \
  X(kTensorShare, "TENSOR_SHARE", kResourceExhausted,                                    \
    "The caller holds its share of tensors (--max_tensors_per_engine).")                 \
  X(kTooFragmented, "TOO_FRAGMENTED", kInvalidArgument,                                  \
    "The blocks make too many pieces or runs: split the request.")                       \
  X(kTooManyBlocks, "TOO_MANY_BLOCKS", kInvalidArgument,                                 \
    "A request lists more blocks than one request may.")                                 \
  X(kTooManyGpus, "TOO_MANY_GPUS", kFailedPrecondition,                                  \
    "More GPUs than fuselink supports: narrow CUDA_VISIBLE_DEVICES.")                    \
  X(kTooManyIncoming, "TOO_MANY_INCOMING", kResourceExhausted,                           \
    "The target holds its bound of incoming transfers.")                                 \
  X(kTooManyPendingFds, "TOO_MANY_PENDING_FDS", kResourceExhausted,                      \
    "Too many descriptors wait for RegisterTensor.")                                     \
  X(kTooManyTensors, "TOO_MANY_TENSORS", kResourceExhausted,                             \
    "The agent holds its bound of tensors.")                                             \
  X(kTooManyTransfers, "TOO_MANY_TRANSFERS", kResourceExhausted,                         \
    "The agent holds its bound of transfers in flight: retry later.")                    \
  X(kTransferFinished, "TRANSFER_FINISHED", kFailedPrecondition,                         \
    "The transfer has finished already.")                                                \
  X(kTransferShare, "TRANSFER_SHARE", kResourceExhausted,                                \
    "The caller holds its share of transfers in flight.")                                \
  X(kUnknownNode, "UNKNOWN_NODE", kNotFound, "No peer of that name.")                    \
  X(kUnknownPolicy, "UNKNOWN_POLICY", kInvalidArgument,                                  \
    "The scheduling policy is not fuselink, static or stripe.")                          \
  X(kUnknownTensor, "UNKNOWN_TENSOR", kNotFound, "No tensor of that name.")              \
  X(kUnknownTransfer, "UNKNOWN_TRANSFER", kNotFound,                                     \
    "No transfer of that id (of the caller's).")                                         \
  X(kUnsealedMemory, "UNSEALED_MEMORY", kFailedPrecondition,                             \
    "Lent host memory cannot be sealed against shrinking: lend a sealable memfd.")       \
  X(kVersionMismatch, "VERSION_MISMATCH", kFailedPrecondition,                           \
    "The peer speaks another protocol version.")                                         \
  X(kWatchShare, "WATCH_SHARE", kResourceExhausted,                                      \
    "The caller holds its share of watch streams (--max_watches_per_identity).")         \
  X(kWatcherTooSlow, "WATCHER_TOO_SLOW", kResourceExhausted,                             \
    "The watcher fell too far behind: watch again.")                                     \
  X(kWindowClosed, "WINDOW_CLOSED", kNotFound,                                           \
    "The target has no open window under that key: the transfer ended there.")           \
  X(kWindowFailed, "WINDOW_FAILED", kUnavailable,                                        \
    "The target could not open a window for the transfer.")                              \
  X(kWindowNotYours, "WINDOW_NOT_YOURS", kPermissionDenied,                              \
    "The target's window belongs to another peer.")                                      \
  X(kWriteSealedMemory, "WRITE_SEALED_MEMORY", kFailedPrecondition,                      \
    "Lent host memory is sealed against writes, and transfers land in it.")

namespace reasons {
#define FUSELINK_REASON_CONSTANT(id, name, code, meaning) \
  inline constexpr Reason id{name, absl::StatusCode::code, meaning};
FUSELINK_REASONS(FUSELINK_REASON_CONSTANT)
#undef FUSELINK_REASON_CONSTANT
}  // namespace reasons

// Every reason, in the order above.
#define FUSELINK_REASON_ENTRY(id, name, code, meaning) reasons::id,
inline constexpr std::array kAllReasons = {FUSELINK_REASONS(FUSELINK_REASON_ENTRY)};
#undef FUSELINK_REASON_ENTRY

namespace errors_internal {

constexpr bool IsUpper(char c) { return c >= 'A' && c <= 'Z'; }
constexpr bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// `name` less a family's "_*".
constexpr absl::string_view Stem(absl::string_view name) {
  const bool family = name.size() >= 2 && name.substr(name.size() - 2) == "_*";
  return family ? name.substr(0, name.size() - 2) : name;
}

// "kUnknownTensor" for "UNKNOWN_TENSOR"; "kCudaError" for the family "CUDA_ERROR_*".
constexpr bool ConstantNames(absl::string_view constant, absl::string_view name) {
  name = Stem(name);
  if (constant.size() < 2 || constant[0] != 'k') return false;
  size_t at = 0;
  for (size_t i = 1; i < constant.size(); ++i) {
    const char c = constant[i];
    if (i > 1 && IsUpper(c) && (at >= name.size() || name[at++] != '_')) return false;
    const char upper = IsUpper(c) || IsDigit(c) ? c : static_cast<char>(c - 'a' + 'A');
    if (at >= name.size() || name[at++] != upper) return false;
  }
  return at == name.size();
}

constexpr bool WellFormed(absl::string_view name) {
  name = Stem(name);
  if (name.empty() || !IsUpper(name.front()) || name.back() == '_') return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (!IsUpper(c) && !IsDigit(c) && c != '_') return false;
    if (c == '_' && name[i - 1] == '_') return false;
  }
  return true;
}

// Alphabetical as a reader sorts: '_' before any letter, so NO_GPU before NODE_MISMATCH.
constexpr bool Before(absl::string_view a, absl::string_view b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i] == b[i]) continue;
    if (a[i] == '_' || b[i] == '_') return a[i] == '_';
    return a[i] < b[i];
  }
  return a.size() < b.size();
}

constexpr bool SortedAndUnique() {
  for (size_t i = 1; i < kAllReasons.size(); ++i) {
    if (!Before(kAllReasons[i - 1].name, kAllReasons[i].name)) return false;
  }
  return true;
}

}  // namespace errors_internal

#define FUSELINK_REASON_CHECK(id, name, code, meaning)                                  \
  static_assert(errors_internal::WellFormed(name), name " is not UPPER_SNAKE_CASE");    \
  static_assert(errors_internal::ConstantNames(#id, name), #id " does not name " name); \
  static_assert(absl::StatusCode::code != absl::StatusCode::kOk, name " comes with OK");
FUSELINK_REASONS(FUSELINK_REASON_CHECK)
#undef FUSELINK_REASON_CHECK
static_assert(errors_internal::SortedAndUnique(),
              "FUSELINK_REASONS: keep the names unique and in alphabetical order");

}  // namespace fuselink
