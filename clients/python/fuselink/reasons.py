"""Every reason the agent gives for an error (FuselinkError.reason).

Generated from the agent's catalogue, agent/common/errors.h, by tools/errors_doc; do
not edit. Regenerate with `ninja -C build errors_docs`. docs/errors.md is the same table.

Each reason is a constant of its own name; REASONS maps it to the name of the
grpc.StatusCode it comes with (grpc.StatusCode[code] is the code) and one line of what
it means. A name ending in "_*" is a family (the CUDA driver's own error names): match
it with lookup(). Plain data, so that it imports without grpc.
"""

ALIASED_REGIONS = "ALIASED_REGIONS"
ALIASED_TENSORS = "ALIASED_TENSORS"
BAD_DEADLINE = "BAD_DEADLINE"
BAD_FD_TOKEN = "BAD_FD_TOKEN"
BAD_GPU_HANDLE = "BAD_GPU_HANDLE"
BAD_GRANT = "BAD_GRANT"
BAD_HOME_GPU = "BAD_HOME_GPU"
BAD_LAYOUT = "BAD_LAYOUT"
BAD_LEASE = "BAD_LEASE"
BAD_MEMORY = "BAD_MEMORY"
BAD_NAME = "BAD_NAME"
BAD_OWNER_FD = "BAD_OWNER_FD"
BAD_POLICY = "BAD_POLICY"
BAD_RELAY_MODE = "BAD_RELAY_MODE"
BAD_REQUEST_ID = "BAD_REQUEST_ID"
BAD_SOCKET_PATH = "BAD_SOCKET_PATH"
BAD_SOURCE_NIC = "BAD_SOURCE_NIC"
BAD_TLS_FILES = "BAD_TLS_FILES"
BAD_TOPOLOGY = "BAD_TOPOLOGY"
BAD_TOTAL = "BAD_TOTAL"
BAD_TRANSPORT = "BAD_TRANSPORT"
BAD_UTF8 = "BAD_UTF8"
BLOCK_COUNT_MISMATCH = "BLOCK_COUNT_MISMATCH"
BLOCK_OUT_OF_RANGE = "BLOCK_OUT_OF_RANGE"
BLOCK_SIZE_MISMATCH = "BLOCK_SIZE_MISMATCH"
CANCELLED = "CANCELLED"
COUNTER_READ = "COUNTER_READ"
CUDA_DRIVER_TOO_OLD = "CUDA_DRIVER_TOO_OLD"
CUDA_ERROR_PREFIX = "CUDA_ERROR_"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
DEADLINE = "DEADLINE"
DUPLICATE_TARGET_BLOCK = "DUPLICATE_TARGET_BLOCK"
EMPTY_REQUEST = "EMPTY_REQUEST"
FABRIC_ACK_TIMEOUT = "FABRIC_ACK_TIMEOUT"
FABRIC_AUTH = "FABRIC_AUTH"
FABRIC_MALFORMED = "FABRIC_MALFORMED"
FABRIC_NO_KEY = "FABRIC_NO_KEY"
FABRIC_PEER_CONNECTIONS = "FABRIC_PEER_CONNECTIONS"
FABRIC_STALL = "FABRIC_STALL"
FORWARDING_OFF = "FORWARDING_OFF"
GETIFADDRS = "GETIFADDRS"
GPU_COPY_TIMEOUT = "GPU_COPY_TIMEOUT"
GPU_HANDLE_CLOSING = "GPU_HANDLE_CLOSING"
GPU_HANDLE_OWNED = "GPU_HANDLE_OWNED"
IDS_DISAGREE = "IDS_DISAGREE"
INCOMING_PREPARES_BUSY = "INCOMING_PREPARES_BUSY"
INCOMPLETE_COMMIT = "INCOMPLETE_COMMIT"
LAYER_OUT_OF_RANGE = "LAYER_OUT_OF_RANGE"
LAYOUT_EXCEEDS_MEMORY = "LAYOUT_EXCEEDS_MEMORY"
LAYOUT_PART_SHARE = "LAYOUT_PART_SHARE"
LEASE_EXPIRED = "LEASE_EXPIRED"
LINK_LOCAL_ADDRESS = "LINK_LOCAL_ADDRESS"
LOCAL_COPY = "LOCAL_COPY"
LOCAL_TARGET = "LOCAL_TARGET"
MALFORMED_REQUEST = "MALFORMED_REQUEST"
MIG_UNSUPPORTED = "MIG_UNSUPPORTED"
MISSING_ID = "MISSING_ID"
NO_CLIENT_CERTIFICATE = "NO_CLIENT_CERTIFICATE"
NO_COUNTERS = "NO_COUNTERS"
NO_CUDA_DRIVER = "NO_CUDA_DRIVER"
NO_DATA_NIC = "NO_DATA_NIC"
NO_DMABUF = "NO_DMABUF"
NO_DMABUF_EXPORT = "NO_DMABUF_EXPORT"
NO_GPU = "NO_GPU"
NO_IDENTITY = "NO_IDENTITY"
NO_LEASE = "NO_LEASE"
NO_NETDEV = "NO_NETDEV"
NO_PEER_ACCESS = "NO_PEER_ACCESS"
NO_RDMA_PORT = "NO_RDMA_PORT"
NO_VERDICT = "NO_VERDICT"
NODE_MISMATCH = "NODE_MISMATCH"
NOT_LAYER_BY_LAYER = "NOT_LAYER_BY_LAYER"
NOT_OWNER = "NOT_OWNER"
OUTSIDE_WINDOW = "OUTSIDE_WINDOW"
OWNER_EXITED = "OWNER_EXITED"
OWNER_TOKEN_REQUIRED = "OWNER_TOKEN_REQUIRED"
PEER_LOST = "PEER_LOST"
PEER_MISMATCH = "PEER_MISMATCH"
PEER_UNREACHABLE = "PEER_UNREACHABLE"
PREPARE_QUEUE_FULL = "PREPARE_QUEUE_FULL"
PROTOCOL = "PROTOCOL"
QUEUE_FULL = "QUEUE_FULL"
RAIL_MISMATCH = "RAIL_MISMATCH"
RANGE_OUTSIDE_ALLOCATION = "RANGE_OUTSIDE_ALLOCATION"
REFUSED = "REFUSED"
REGISTRATIONS_BUSY = "REGISTRATIONS_BUSY"
RELAY_FAILED = "RELAY_FAILED"
REQUEST_ID_REUSED = "REQUEST_ID_REUSED"
ROLE_REQUIRED = "ROLE_REQUIRED"
RUNTIME_DIR_UNSAFE = "RUNTIME_DIR_UNSAFE"
SAME_BLOCKS = "SAME_BLOCKS"
SHUTTING_DOWN = "SHUTTING_DOWN"
SOURCE_ABORTED = "SOURCE_ABORTED"
SOURCE_IDLE = "SOURCE_IDLE"
SOURCE_NOT_LOCAL = "SOURCE_NOT_LOCAL"
SOURCE_SHARE = "SOURCE_SHARE"
TARGET_FAILED = "TARGET_FAILED"
TARGET_PROTOCOL = "TARGET_PROTOCOL"
TENSOR_ACCESS = "TENSOR_ACCESS"
TENSOR_EXISTS = "TENSOR_EXISTS"
TENSOR_IN_USE = "TENSOR_IN_USE"
TENSOR_SHARE = "TENSOR_SHARE"
TOO_FRAGMENTED = "TOO_FRAGMENTED"
TOO_MANY_BLOCKS = "TOO_MANY_BLOCKS"
TOO_MANY_GPUS = "TOO_MANY_GPUS"
TOO_MANY_INCOMING = "TOO_MANY_INCOMING"
TOO_MANY_PENDING_FDS = "TOO_MANY_PENDING_FDS"
TOO_MANY_TENSORS = "TOO_MANY_TENSORS"
TOO_MANY_TRANSFERS = "TOO_MANY_TRANSFERS"
TRANSFER_FINISHED = "TRANSFER_FINISHED"
TRANSFER_SHARE = "TRANSFER_SHARE"
UNKNOWN_NODE = "UNKNOWN_NODE"
UNKNOWN_POLICY = "UNKNOWN_POLICY"
UNKNOWN_TENSOR = "UNKNOWN_TENSOR"
UNKNOWN_TRANSFER = "UNKNOWN_TRANSFER"
UNSEALED_MEMORY = "UNSEALED_MEMORY"
VERSION_MISMATCH = "VERSION_MISMATCH"
WATCH_SHARE = "WATCH_SHARE"
WATCHER_TOO_SLOW = "WATCHER_TOO_SLOW"
WINDOW_CLOSED = "WINDOW_CLOSED"
WINDOW_FAILED = "WINDOW_FAILED"
WINDOW_NOT_YOURS = "WINDOW_NOT_YOURS"
WRITE_SEALED_MEMORY = "WRITE_SEALED_MEMORY"

REASONS = {
    "ALIASED_REGIONS": ("INVALID_ARGUMENT",
        "Two regions of one tensor are the same memory (one file or allocation lent twice)."),
    "ALIASED_TENSORS": ("INVALID_ARGUMENT",
        "Source and target tensors share memory: the move would overwrite what it reads."),
    "BAD_DEADLINE": ("INVALID_ARGUMENT",
        "The request's deadline is not a valid timestamp."),
    "BAD_FD_TOKEN": ("INVALID_ARGUMENT",
        "fd_token is unknown, used or expired: pass the descriptor over the handle socket first."),
    "BAD_GPU_HANDLE": ("INVALID_ARGUMENT",
        "A CUDA IPC handle the driver refused, or one of the wrong size."),
    "BAD_GRANT": ("INVALID_ARGUMENT",
        "A tensor's readers or writers name no valid identity or role."),
    "BAD_HOME_GPU": ("INVALID_ARGUMENT",
        "The GPU named for a tensor does not exist on this node."),
    "BAD_LAYOUT": ("INVALID_ARGUMENT",
        "A tensor's layout is inconsistent or over its bounds."),
    "BAD_LEASE": ("INVALID_ARGUMENT",
        "lease_ms is over its bound."),
    "BAD_MEMORY": ("INVALID_ARGUMENT",
        "The memory lent for a tensor is empty, misaligned or not what its kind says."),
    "BAD_NAME": ("INVALID_ARGUMENT",
        "A tensor name is empty, too long or has characters outside [A-Za-z0-9._/-]."),
    "BAD_OWNER_FD": ("INVALID_ARGUMENT",
        "owner_fd_token names a descriptor that is not a pidfd of the lending process."),
    "BAD_POLICY": ("INVALID_ARGUMENT",
        "The access policy file does not parse or names unknown roles."),
    "BAD_RELAY_MODE": ("INVALID_ARGUMENT",
        "A GPU relay stage is neither d1 (kernel) nor d2 (copy engine)."),
    "BAD_REQUEST_ID": ("INVALID_ARGUMENT",
        "request_id is empty or longer than its bound."),
    "BAD_SOCKET_PATH": ("INVALID_ARGUMENT",
        "The node name cannot make a handle socket path: give --handle_socket."),
    "BAD_SOURCE_NIC": ("INVALID_ARGUMENT",
        "A peer named a source NIC that is not one of the rails."),
    "BAD_TLS_FILES": ("INVALID_ARGUMENT",
        "A TLS certificate, key or CA file is missing or does not parse."),
    "BAD_TOPOLOGY": ("INVALID_ARGUMENT",
        "The topology (--topology file or a peer's) is inconsistent."),
    "BAD_TOTAL": ("INVALID_ARGUMENT",
        "A peer's total_bytes disagrees with the blocks it asked for."),
    "BAD_TRANSPORT": ("INVALID_ARGUMENT",
        "--transport is not auto, tcp or verbs."),
    "BAD_UTF8": ("INVALID_ARGUMENT",
        "A string field of the request is not valid UTF-8."),
    "BLOCK_COUNT_MISMATCH": ("INVALID_ARGUMENT",
        "Source and target list different numbers of blocks."),
    "BLOCK_OUT_OF_RANGE": ("OUT_OF_RANGE",
        "A block id is past the tensor's blocks per layer."),
    "BLOCK_SIZE_MISMATCH": ("INVALID_ARGUMENT",
        "Source and target blocks have different sizes."),
    "CANCELLED": ("CANCELLED",
        "The transfer was cancelled (CancelTransfer)."),
    "COUNTER_READ": ("UNAVAILABLE",
        "A NIC's kernel counter could not be read; the next read may succeed."),
    "CUDA_DRIVER_TOO_OLD": ("FAILED_PRECONDITION",
        "The NVIDIA driver lacks an entry point fuselink needs: update it."),
    "CUDA_ERROR_*": ("INTERNAL",
        "A CUDA driver call failed; the reason is CUDA's own name for the error and the code follows from it."),
    "CUDA_VISIBLE_DEVICES": ("FAILED_PRECONDITION",
        "CUDA_VISIBLE_DEVICES does not parse or names GPUs that are not there."),
    "DEADLINE": ("DEADLINE_EXCEEDED",
        "The transfer's deadline passed."),
    "DUPLICATE_TARGET_BLOCK": ("INVALID_ARGUMENT",
        "A target block is listed twice: two writes would race for it."),
    "EMPTY_REQUEST": ("INVALID_ARGUMENT",
        "A transfer lists no blocks."),
    "FABRIC_ACK_TIMEOUT": ("DEADLINE_EXCEEDED",
        "A fabric connection (TCP) or QP (verbs) closed: the target acknowledged no write for too long."),
    "FABRIC_AUTH": ("UNAUTHENTICATED",
        "A fabric connection's handshake did not prove the fabric key of the pair of nodes."),
    "FABRIC_MALFORMED": ("INVALID_ARGUMENT",
        "A fabric connection closed on a frame that does not decode."),
    "FABRIC_NO_KEY": ("FAILED_PRECONDITION",
        "No fabric key for the peer yet: the peer bootstrap has not introduced it."),
    "FABRIC_PEER_CONNECTIONS": ("RESOURCE_EXHAUSTED",
        "A peer holds its share of fabric connections to this node."),
    "FABRIC_STALL": ("DEADLINE_EXCEEDED",
        "A fabric connection (TCP, or a verbs control connection) closed: the peer stopped mid-frame for too long."),
    "FORWARDING_OFF": ("PERMISSION_DENIED",
        "The source's agent runs no forwarded transfers (--accept_forwarded): ask it directly."),
    "GETIFADDRS": ("UNAVAILABLE",
        "getifaddrs failed listing the interfaces."),
    "GPU_COPY_TIMEOUT": ("DEADLINE_EXCEEDED",
        "A GPU copy did not finish within --gpu_copy_timeout_ms: the GPU is likely hung. The write fails over; the memory the copy touches stays out of use until it ends."),
    "GPU_HANDLE_CLOSING": ("UNAVAILABLE",
        "This CUDA IPC handle is still being closed after an unregister: retry."),
    "GPU_HANDLE_OWNED": ("PERMISSION_DENIED",
        "Another owner has lent this CUDA IPC handle; an import is never shared."),
    "IDS_DISAGREE": ("INVALID_ARGUMENT",
        "transfer_id and request_id name different transfers."),
    "INCOMING_PREPARES_BUSY": ("RESOURCE_EXHAUSTED",
        "The target has as many PrepareIncoming calls from this node queued as it takes."),
    "INCOMPLETE_COMMIT": ("DATA_LOSS",
        "The source committed before every byte of the prepared blocks landed."),
    "LAYER_OUT_OF_RANGE": ("OUT_OF_RANGE",
        "A layer range is empty or past the tensor's or transfer's layers."),
    "LAYOUT_EXCEEDS_MEMORY": ("INVALID_ARGUMENT",
        "The layout needs more bytes than the memory lent."),
    "LAYOUT_PART_SHARE": ("RESOURCE_EXHAUSTED",
        "The caller holds its share of layout parts (--max_layout_parts_per_engine)."),
    "LEASE_EXPIRED": ("DEADLINE_EXCEEDED",
        "The transfer's lease ran out: nobody renewed it (ExtendLease)."),
    "LINK_LOCAL_ADDRESS": ("INVALID_ARGUMENT",
        "A NIC's address is IPv6 link-local, which is not routed between nodes."),
    "LOCAL_COPY": ("INTERNAL",
        "An in-node copy failed or cannot be made."),
    "LOCAL_TARGET": ("UNIMPLEMENTED",
        "Source and target are the same node and in-node moves are off."),
    "MALFORMED_REQUEST": ("INVALID_ARGUMENT",
        "The request message is missing or does not parse."),
    "MIG_UNSUPPORTED": ("FAILED_PRECONDITION",
        "CUDA_VISIBLE_DEVICES names a MIG instance; fuselink needs whole GPUs."),
    "MISSING_ID": ("INVALID_ARGUMENT",
        "Neither transfer_id nor request_id is given."),
    "NO_CLIENT_CERTIFICATE": ("UNAUTHENTICATED",
        "The caller showed no client certificate of the agent's CA."),
    "NO_COUNTERS": ("NOT_FOUND",
        "A NIC has no kernel byte counters to watch."),
    "NO_CUDA_DRIVER": ("FAILED_PRECONDITION",
        "No NVIDIA driver (libcuda) on this node."),
    "NO_DATA_NIC": ("FAILED_PRECONDITION",
        "Topology discovery found no NIC that can carry data."),
    "NO_DMABUF": ("UNIMPLEMENTED",
        "The GPU cannot export dma-bufs."),
    "NO_DMABUF_EXPORT": ("UNIMPLEMENTED",
        "The NVIDIA driver lacks dma-buf export (cuMemGetHandleForAddressRange)."),
    "NO_GPU": ("FAILED_PRECONDITION",
        "The GPU named is not a CUDA device of this agent."),
    "NO_IDENTITY": ("UNAUTHENTICATED",
        "The client certificate names no SPIFFE ID."),
    "NO_LEASE": ("FAILED_PRECONDITION",
        "The transfer was started without a lease."),
    "NO_NETDEV": ("NOT_FOUND",
        "No interface in this network namespace holds the NIC's address."),
    "NO_PEER_ACCESS": ("FAILED_PRECONDITION",
        "One GPU cannot access another as a peer (no NVLink or PCIe P2P path)."),
    "NO_RDMA_PORT": ("NOT_FOUND",
        "No RDMA port belongs to the NIC's netdev."),
    "NO_VERDICT": ("UNAVAILABLE",
        "The target gave no verdict: the transfer may or may not have landed."),
    "NODE_MISMATCH": ("PERMISSION_DENIED",
        "A peer spoke for a node its certificate does not name."),
    "NOT_LAYER_BY_LAYER": ("FAILED_PRECONDITION",
        "MarkLayersReady on a transfer not started layer by layer."),
    "NOT_OWNER": ("PERMISSION_DENIED",
        "The tensor belongs to another caller."),
    "OUTSIDE_WINDOW": ("OUT_OF_RANGE",
        "A write lies outside the blocks the target prepared."),
    "OWNER_EXITED": ("FAILED_PRECONDITION",
        "The process that lent the tensor exited."),
    "OWNER_TOKEN_REQUIRED": ("PERMISSION_DENIED",
        "cuda_ipc memory needs owner_fd_token, a pidfd of the lending process."),
    "PEER_LOST": ("UNAVAILABLE",
        "Every NIC to the peer failed mid-transfer."),
    "PEER_MISMATCH": ("FAILED_PRECONDITION",
        "The agent at a peer's address calls itself by another name."),
    "PEER_UNREACHABLE": ("UNAVAILABLE",
        "The peer's agent cannot be reached."),
    "PREPARE_QUEUE_FULL": ("RESOURCE_EXHAUSTED",
        "The source has as many prepares for this target queued as it takes."),
    "PROTOCOL": ("INVALID_ARGUMENT",
        "A peer broke the transfer protocol."),
    "QUEUE_FULL": ("RESOURCE_EXHAUSTED",
        "A worker pool's queue is full."),
    "RAIL_MISMATCH": ("FAILED_PRECONDITION",
        "Two nodes' rails differ: the fabric pairs NIC i with NIC i."),
    "RANGE_OUTSIDE_ALLOCATION": ("OUT_OF_RANGE",
        "A CUDA IPC range leaves the exported allocation."),
    "REFUSED": ("INTERNAL",
        "The target refused a write for no reason it names."),
    "REGISTRATIONS_BUSY": ("RESOURCE_EXHAUSTED",
        "The caller has as many RegisterTensor calls queued as the agent takes."),
    "RELAY_FAILED": ("INTERNAL",
        "A GPU relay stage failed."),
    "REQUEST_ID_REUSED": ("ALREADY_EXISTS",
        "request_id was used already for a transfer with other content."),
    "ROLE_REQUIRED": ("PERMISSION_DENIED",
        "The caller holds no role that allows the call."),
    "RUNTIME_DIR_UNSAFE": ("FAILED_PRECONDITION",
        "The handle socket's directory or path is not safe to use."),
    "SAME_BLOCKS": ("INVALID_ARGUMENT",
        "A block is both source and target."),
    "SHUTTING_DOWN": ("UNAVAILABLE",
        "The agent is shutting down."),
    "SOURCE_ABORTED": ("ABORTED",
        "The source stopped the transfer."),
    "SOURCE_IDLE": ("UNAVAILABLE",
        "The target heard nothing from the source for too long."),
    "SOURCE_NOT_LOCAL": ("FAILED_PRECONDITION",
        "The source tensor is on another node: ask that node's agent."),
    "SOURCE_SHARE": ("RESOURCE_EXHAUSTED",
        "The source node holds its share of the target's incoming slots."),
    "TARGET_FAILED": ("INTERNAL",
        "The target failed the transfer for a reason it did not name."),
    "TARGET_PROTOCOL": ("INTERNAL",
        "The target's answer broke the transfer protocol."),
    "TENSOR_ACCESS": ("PERMISSION_DENIED",
        "The caller is not granted the tensor it moves."),
    "TENSOR_EXISTS": ("ALREADY_EXISTS",
        "A tensor of that name is registered already."),
    "TENSOR_IN_USE": ("FAILED_PRECONDITION",
        "The tensor is in use by a transfer: cancel it or wait."),
    "TENSOR_SHARE": ("RESOURCE_EXHAUSTED",
        "The caller holds its share of tensors (--max_tensors_per_engine)."),
    "TOO_FRAGMENTED": ("INVALID_ARGUMENT",
        "The blocks make too many pieces or runs: split the request."),
    "TOO_MANY_BLOCKS": ("INVALID_ARGUMENT",
        "A request lists more blocks than one request may."),
    "TOO_MANY_GPUS": ("FAILED_PRECONDITION",
        "More GPUs than fuselink supports: narrow CUDA_VISIBLE_DEVICES."),
    "TOO_MANY_INCOMING": ("RESOURCE_EXHAUSTED",
        "The target holds its bound of incoming transfers."),
    "TOO_MANY_PENDING_FDS": ("RESOURCE_EXHAUSTED",
        "Too many descriptors wait for RegisterTensor."),
    "TOO_MANY_TENSORS": ("RESOURCE_EXHAUSTED",
        "The agent holds its bound of tensors."),
    "TOO_MANY_TRANSFERS": ("RESOURCE_EXHAUSTED",
        "The agent holds its bound of transfers in flight: retry later."),
    "TRANSFER_FINISHED": ("FAILED_PRECONDITION",
        "The transfer has finished already."),
    "TRANSFER_SHARE": ("RESOURCE_EXHAUSTED",
        "The caller holds its share of transfers in flight."),
    "UNKNOWN_NODE": ("NOT_FOUND",
        "No peer of that name."),
    "UNKNOWN_POLICY": ("INVALID_ARGUMENT",
        "The scheduling policy is not fuselink, static or stripe."),
    "UNKNOWN_TENSOR": ("NOT_FOUND",
        "No tensor of that name."),
    "UNKNOWN_TRANSFER": ("NOT_FOUND",
        "No transfer of that id (of the caller's)."),
    "UNSEALED_MEMORY": ("FAILED_PRECONDITION",
        "Lent host memory cannot be sealed against shrinking: lend a sealable memfd."),
    "VERSION_MISMATCH": ("FAILED_PRECONDITION",
        "The peer speaks another protocol version."),
    "WATCH_SHARE": ("RESOURCE_EXHAUSTED",
        "The caller holds its share of watch streams (--max_watches_per_identity)."),
    "WATCHER_TOO_SLOW": ("RESOURCE_EXHAUSTED",
        "The watcher fell too far behind: watch again."),
    "WINDOW_CLOSED": ("NOT_FOUND",
        "The target has no open window under that key: the transfer ended there."),
    "WINDOW_FAILED": ("UNAVAILABLE",
        "The target could not open a window for the transfer."),
    "WINDOW_NOT_YOURS": ("PERMISSION_DENIED",
        "The target's window belongs to another peer."),
    "WRITE_SEALED_MEMORY": ("FAILED_PRECONDITION",
        "Lent host memory is sealed against writes, and transfers land in it."),
}


def lookup(reason):
    """(code, meaning) of `reason`, a family's for a name in one; None if unknown."""
    if reason in REASONS:
        return REASONS[reason]
    for name, entry in REASONS.items():
        if name.endswith("_*") and reason.startswith(name[:-1]):
            return entry
    return None
