"""What the synchronous and the asyncio clients share: the requests they send and what
they make of the answers. Pure functions of their arguments, but for the memory
lending (memory.py), which blocks briefly on the agent's handle socket; the asyncio
client runs that part off its event loop.
"""

from __future__ import annotations

import collections
import uuid
from typing import Any, Callable, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import grpc

from fuselink.v1 import agent_pb2, tensor_pb2

from .errors import FuselinkError, code_from_int, from_rpc_error
from .memory import HostBuffer, cuda_ipc_export, is_cuda_tensor, send_fd, send_owner_pidfd

# The agent's --runtime_dir default, where its handle socket is <node>.sock.
DEFAULT_RUNTIME_DIR = "/run/fuselink"
# Deadline of the short calls (register, get, unregister, topology), in seconds.
DEFAULT_CALL_TIMEOUT_S = 10
# Finished transfers a watch keeps for wait() before the oldest is dropped; an engine
# that never waits must not grow without bound.
MAX_PENDING_EVENTS = 1024
# The initial-metadata entry the agent sends once a watch is in place.
WATCH_READY_KEY = "fuselink-watch-ready"
# How long a watch without that mark waits for the refusal's status to arrive.
REFUSAL_WAIT_S = 2.0

# A PyTorch CUDA tensor or a HostBuffer (torch stays an optional dependency).
Lendable = Any
Layers = Union[Tuple[int, int], range]


class Part(NamedTuple):
    """One part of every block of a layer (fuselink.v1.BlockPart): block b's part is
    `bytes` at offset_bytes + b * block_stride_bytes (0: bytes) of region `region`."""
    region: int
    offset_bytes: int
    bytes: int
    block_stride_bytes: int = 0


def size_of(tensor: Lendable) -> int:
    """Bytes of a lendable tensor, or TypeError."""
    if is_cuda_tensor(tensor):
        return tensor.numel() * tensor.element_size()
    if isinstance(tensor, HostBuffer):
        return tensor.size_bytes
    raise TypeError(f"expected a PyTorch CUDA tensor or a HostBuffer, not "
                    f"{type(tensor).__name__}")


def handle_socket_of(node: str) -> str:
    """The agent's default handle socket for `node`."""
    return f"{DEFAULT_RUNTIME_DIR}/{node}.sock"


def lend_memory(tensor: Lendable, handle_socket: Callable[[], str]):
    """The fuselink.v1.TensorMemory that lends `tensor`, its bytes, and whether it is
    on a GPU. A HostBuffer's memfd goes over handle_socket() (blocks briefly)."""
    if is_cuda_tensor(tensor):
        handle, offset_bytes, size_bytes, gpu = cuda_ipc_export(tensor)
        return tensor_pb2.TensorMemory(cuda_ipc=tensor_pb2.CudaIpcMemory(
            handle=handle, offset_bytes=offset_bytes, size_bytes=size_bytes,
            gpu=gpu)), size_bytes, True
    size_bytes = size_of(tensor)  # a TypeError unless a HostBuffer
    return tensor_pb2.TensorMemory(host=tensor_pb2.HostMemory(
        fd_token=send_fd(handle_socket(), tensor.fd), size_bytes=size_bytes)), size_bytes, False


class Registration(NamedTuple):
    """A RegisterTensorRequest ready to send, and the objects whose memory it lends
    (kept alive by the client until the tensor is unregistered)."""
    request: Any
    tensors: list


def kv_cache_registration(name, tensor, layers, blocks_per_layer, block_bytes,
                          block_stride_bytes, layer_stride_bytes, home_gpu,
                          handle_socket, grants) -> Registration:
    """register_kv_cache's request (its arguments are documented there)."""
    memory, size_bytes, cuda = lend_memory(tensor, handle_socket)
    if block_bytes is None:
        block_bytes, extra = divmod(size_bytes, layers * blocks_per_layer)
        if extra or block_bytes == 0:
            raise ValueError(f"{size_bytes} bytes do not split into {layers} x "
                             f"{blocks_per_layer} equal blocks; give block_bytes")
    request = agent_pb2.RegisterTensorRequest(
        name=name, home_gpu=home_gpu, memory=memory,
        layout=tensor_pb2.Layout(layers=layers, blocks_per_layer=blocks_per_layer,
                                 block_bytes=block_bytes,
                                 block_stride_bytes=block_stride_bytes,
                                 layer_stride_bytes=layer_stride_bytes))
    grants.apply(request, cuda, handle_socket)
    return Registration(request, [tensor])


def kv_layers_parts(layers: Sequence, blocks_per_layer: int,
                    part_bytes: Optional[int]) -> Tuple[list, List[List[Part]]]:
    """register_kv_layers' regions and parts, from its `layers` (documented there)."""
    if not layers:
        raise ValueError("layers is empty")
    regions, parts = [], []
    for index, entry in enumerate(layers):
        pair = isinstance(entry, (tuple, list))
        halves = list(entry) if pair else [entry]
        if pair and len(halves) != 2:
            raise ValueError(f"layer {index}: a pair (k, v), not {len(halves)} tensors")
        layer_parts = []
        for half in halves:
            size_bytes = size_of(half)
            count = blocks_per_layer if pair else 2 * blocks_per_layer
            if pair and part_bytes is not None:
                bytes_, fits = part_bytes, 0 < part_bytes * count <= size_bytes
            else:
                bytes_ = size_bytes // count
                fits = bytes_ > 0 and bytes_ * count == size_bytes
            if not fits:
                raise ValueError(f"layer {index}: {size_bytes} bytes do not hold "
                                 f"{count} equal parts" + ("; give part_bytes" if pair else ""))
            offsets = [0] if pair else [0, blocks_per_layer * bytes_]
            layer_parts += [Part(len(regions), offset, bytes_) for offset in offsets]
            regions.append(half)
        parts.append(layer_parts)
    return regions, parts


def kv_parts_registration(name, regions, blocks_per_layer, parts, home_gpu, handle_socket,
                          grants) -> Registration:
    """register_kv_parts' request (its arguments are documented there)."""
    if not parts or not regions:
        raise ValueError("parts and regions must not be empty")
    per_block = len(parts[0])
    if any(len(layer) != per_block for layer in parts):
        raise ValueError("every layer needs the same number of parts")
    layout = tensor_pb2.Layout(layers=len(parts), blocks_per_layer=blocks_per_layer,
                               parts_per_block=per_block)
    for layer in parts:
        for p in layer:
            layout.parts.add(region=p.region, offset_bytes=p.offset_bytes,
                             bytes=p.bytes, block_stride_bytes=p.block_stride_bytes)
    memories, cuda = [], False
    for region in regions:
        memory, _, cuda = lend_memory(region, handle_socket)
        memories.append(memory)
    request = agent_pb2.RegisterTensorRequest(name=name, home_gpu=home_gpu,
                                              regions=memories, layout=layout)
    grants.apply(request, cuda, handle_socket)
    return Registration(request, list(regions))


class Grants(NamedTuple):
    """Who else may use a tensor, and whether the agent gets a pidfd of this process
    (register_kv_cache's owner_pidfd, readers, writers)."""
    owner_pidfd: Optional[bool]
    readers: Optional[Iterable[str]]
    writers: Optional[Iterable[str]]

    def apply(self, request, cuda: bool, handle_socket: Callable[[], str]) -> None:
        request.readers.extend(self.readers or [])
        request.writers.extend(self.writers or [])
        owner_pidfd = cuda if self.owner_pidfd is None else self.owner_pidfd
        if cuda and not owner_pidfd:
            # The agent takes a CUDA IPC handle only with a token from its handle
            # socket, which proves the lender is a local process (docs/security.md).
            raise ValueError("CUDA tensors are lent with owner_pidfd; the agent "
                             "refuses them without it (OWNER_TOKEN_REQUIRED)")
        if owner_pidfd:
            request.owner_fd_token = send_owner_pidfd(handle_socket())


def transfer_request(source_node: str, source_tensor: str, blocks: Iterable[int],
                     target_node: str, target_tensor: str,
                     target_blocks: Optional[Iterable[int]], layers: Optional[Layers],
                     request_id: Optional[str], layer_by_layer: bool, lease_ms: int):
    """The TransferRequest of Agent.transfer (its arguments are documented there)."""
    blocks = list(blocks)
    target_blocks = blocks if target_blocks is None else list(target_blocks)
    request = agent_pb2.TransferRequest(
        request_id=request_id or new_request_id(),
        source=agent_pb2.BlockSet(node=source_node, tensor=source_tensor, block_ids=blocks),
        target=agent_pb2.BlockSet(node=target_node, tensor=target_tensor,
                                  block_ids=target_blocks),
        layer_by_layer=layer_by_layer, lease_ms=lease_ms)
    if layers is not None:
        begin, end = (layers.start, layers.stop) if isinstance(layers, range) else layers
        request.layers.CopyFrom(agent_pb2.LayerRange(begin=begin, end=end))
    return request


def new_request_id() -> str:
    """A fresh request id: a transfer nobody named is a new one."""
    return uuid.uuid4().hex


def check_transfer_blocks(blocks, source_node: str, own_node: str) -> None:
    """Without `blocks` a transfer moves every block, which only the source's own
    agent can count."""
    if blocks is None and source_node != own_node:
        raise ValueError("give blocks when the source is another node's tensor")


def stream_failed(error: grpc.RpcError, last) -> FuselinkError:
    """The FuselinkError of a transfer stream that ended in `error` after event `last`."""
    failed = last is not None and last.HasField("failed")
    return from_rpc_error(error, event=last,
                          default_reason=last.failed.reason if failed else "")


def final_event(last):
    """`last` if it is the stream's `completed` event; else the FuselinkError of a
    stream that ended without one."""
    if last is None or not last.HasField("completed"):
        raise FuselinkError(grpc.StatusCode.UNKNOWN,
                            "the transfer stream ended without a final event", event=last)
    return last


# The calls that name one transfer, by method: the request each sends.
def transfer_call(method: str, request_id: str, source_node: str = "", **fields):
    """GetTransfer, CancelTransfer, ExtendLease or LayersReady's request."""
    kind = {"GetTransfer": agent_pb2.GetTransferRequest,
            "CancelTransfer": agent_pb2.CancelTransferRequest,
            "ExtendLease": agent_pb2.ExtendLeaseRequest,
            "LayersReady": agent_pb2.LayersReadyRequest}[method]
    return kind(request_id=request_id, source_node=source_node, **fields)


class EventQueue:
    """A watch's finished transfers, at most MAX_PENDING_EVENTS (the oldest dropped
    first), and why its stream ended. Not locked: its owner holds the lock."""

    def __init__(self):
        self.events = collections.deque()
        self.dropped = 0  # events lost to MAX_PENDING_EVENTS
        self.error = None  # why the stream ended, once it has

    def push(self, event) -> None:
        if len(self.events) == MAX_PENDING_EVENTS:
            self.events.popleft()
            self.dropped += 1
        self.events.append(event)

    def end(self, error: FuselinkError) -> None:
        if self.error is None:
            self.error = error


def watch_result(event):
    """A WatchEvent of a transfer that landed, or the FuselinkError of one that failed."""
    if event.code != 0:
        raise FuselinkError(code_from_int(event.code), event.message, event=event)
    return event


def watch_not_confirmed() -> FuselinkError:
    return FuselinkError(grpc.StatusCode.FAILED_PRECONDITION,
                         "the agent did not confirm the watch is in place")


def watch_timeout(tensor: str, timeout: Optional[float]) -> TimeoutError:
    return TimeoutError(f"no transfer into {tensor or 'any tensor'} finished in {timeout} s")
