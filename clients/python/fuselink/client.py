"""Agent: a connection to one fuselink agent, for engines and orchestrators.

An engine lends a KV cache (a PyTorch CUDA tensor or a HostBuffer) and waits for the
transfers that land in it; an orchestrator asks the source node's agent to move
blocks. Every failed call raises FuselinkError with the agent's code and reason.

    agent = fuselink.Agent("127.0.0.1:50051",
                           tls=fuselink.Tls.from_dir("certs", "engine", "e1"))
    agent.register_kv_cache("kv0", kv_cache, layers=32, blocks_per_layer=64)
    event = agent.wait_for_transfer("kv0", timeout=60)
"""

import collections
import threading
import uuid

import grpc

from fuselink.v1 import agent_pb2, agent_pb2_grpc, tensor_pb2

from .errors import FuselinkError, from_rpc_error
from .memory import HostBuffer, cuda_ipc_export, is_cuda_tensor, send_fd, send_owner_pidfd
from .tls import open_channel
from .watch import Watch

# The agent's --runtime_dir default, where its handle socket is <node>.sock.
DEFAULT_RUNTIME_DIR = "/run/fuselink"
# Deadline of the short calls (register, get, unregister, topology), in seconds.
DEFAULT_CALL_TIMEOUT_S = 10


class Part(collections.namedtuple(
        "Part", ["region", "offset_bytes", "bytes", "block_stride_bytes"], defaults=[0])):
    """One part of every block of a layer (fuselink.v1.BlockPart): block b's part is
    `bytes` at offset_bytes + b * block_stride_bytes (0: bytes) of region `region`."""


def _size_of(tensor):
    """Bytes of a lendable tensor, or TypeError."""
    if is_cuda_tensor(tensor):
        return tensor.numel() * tensor.element_size()
    if isinstance(tensor, HostBuffer):
        return tensor.size_bytes
    raise TypeError(f"expected a PyTorch CUDA tensor or a HostBuffer, not "
                    f"{type(tensor).__name__}")


class Agent:
    """A gRPC channel to one agent, and the memory this process lent through it.

    `address` is the agent's gRPC address (host:port). `handle_socket` is its Unix
    handle socket, needed to lend memory (default: the agent's own default,
    /run/fuselink/<node>.sock). The Agent keeps every lent tensor alive until it is
    unregistered, so PyTorch cannot hand its memory to another tensor while the agent
    still maps it. Closing the Agent does not unregister anything. Safe to share
    between threads.
    """

    def __init__(self, address, handle_socket=None, call_timeout_s=DEFAULT_CALL_TIMEOUT_S,
                 *, tls=None, plaintext=False):
        """`tls` (a fuselink.Tls) is the certificate this client speaks as; without
        it, `plaintext=True` must say that the agent runs with --plaintext. ValueError
        when neither or both are given."""
        self.address = address
        self._handle_socket = handle_socket
        self._call_timeout_s = call_timeout_s
        self._channel = open_channel(address, tls, plaintext)
        self._stub = agent_pb2_grpc.AgentStub(self._channel)
        self._node = None
        self._lock = threading.Lock()
        self._lent = {}  # tensor name -> the object whose memory the agent maps
        self._watches = {}  # tensor name -> Watch started before it was registered

    def _call(self, method, request):
        try:
            return method(request, timeout=self._call_timeout_s)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    @property
    def node(self):
        """The agent's node name (its --node), asked once."""
        if self._node is None:
            self._node = self.topology().node
        return self._node

    @property
    def handle_socket(self):
        """The path given, else the agent's default for its node."""
        return self._handle_socket or f"{DEFAULT_RUNTIME_DIR}/{self.node}.sock"

    def topology(self):
        """The agent's fuselink.v1.Topology: its node name, GPUs and NICs."""
        return self._call(self._stub.GetTopology, agent_pb2.GetTopologyRequest())

    def get_tensor(self, name):
        """The agent's fuselink.v1.Tensor named `name` (NOT_FOUND if none)."""
        return self._call(self._stub.GetTensor, agent_pb2.GetTensorRequest(name=name))

    def register_kv_cache(self, name, tensor, layers, blocks_per_layer, block_bytes=None, *,
                          block_stride_bytes=0, layer_stride_bytes=0, home_gpu=0,
                          owner_pidfd=None, watch=True, readers=None, writers=None):
        """Lends `tensor` to the agent as `layers` x `blocks_per_layer` blocks.

        `tensor` is a contiguous PyTorch CUDA tensor (exported by CUDA IPC; its device
        index must be the agent's GPU number, so run both with the same
        CUDA_VISIBLE_DEVICES) or a HostBuffer (its memfd goes over the handle
        socket). `block_bytes` defaults to the tensor's bytes split evenly into packed
        blocks; the strides follow fuselink.v1.Layout (0: packed). `home_gpu` picks
        the direct NIC of host memory. `owner_pidfd` (default: on for CUDA tensors,
        which the agent takes only with it) hands the agent a pidfd of this process,
        so it lets go of the memory when the process exits. `watch` puts the watch that wait_for_transfer() reads in
        place before this returns (before registering where the agent lets this
        client watch a tensor it does not own yet, else right after), so no transfer
        started after it returns can finish unseen.
        `readers` and `writers` are who may move data out of and into it besides this
        client (identities, prefixes ending in "*", or "role:<role>"; the agent's
        default: ["role:router"]). Returns the agent's fuselink.v1.Tensor.
        """
        memory, size_bytes, cuda = self._memory(tensor)
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
        return self._register(request, [tensor], cuda, owner_pidfd, watch, readers, writers)

    def register_kv_layers(self, name, layers, blocks_per_layer, *, part_bytes=None,
                           home_gpu=0, owner_pidfd=None, watch=True, readers=None,
                           writers=None):
        """Lends a KV cache kept as engines keep it, one allocation per layer (or per
        layer and K/V), as one tensor of `blocks_per_layer` blocks in each layer. Nothing
        is copied: each allocation is registered where it lies.

        `layers` has one entry per layer, each either
          - one tensor (a PyTorch CUDA tensor or a HostBuffer) holding
            [2, blocks_per_layer, ...]: K in its first half, V in its second (vLLM's
            per-layer layout), or
          - a pair (k, v) of two, each holding blocks_per_layer blocks one after the
            other (SGLang's per-layer K and V buffers; `part_bytes` gives a block's
            bytes in each when the buffers hold more than the blocks).
        A block is its K part then its V part in every layer, so a transfer moves blocks
        between these layouts and any other of the same block size. The other
        arguments are register_kv_cache's. Returns the agent's fuselink.v1.Tensor.
        """
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
                size_bytes = _size_of(half)
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
        return self.register_kv_parts(name, regions, blocks_per_layer, parts,
                                      home_gpu=home_gpu, owner_pidfd=owner_pidfd,
                                      watch=watch, readers=readers, writers=writers)

    def register_kv_parts(self, name, regions, blocks_per_layer, parts, *, home_gpu=0,
                          owner_pidfd=None, watch=True, readers=None, writers=None):
        """Lends a KV cache of any layout of parts (fuselink.v1.Layout): `regions` are
        the tensors or HostBuffers it lies in, `parts[l]` the list of fuselink.Part
        that make up every block of layer l, in order (the same number in each layer).
        Part(region, offset_bytes, bytes, block_stride_bytes=0) says block b's part is
        `bytes` at offset_bytes + b * block_stride_bytes (0: bytes) of regions[region].
        register_kv_layers is this for the engines' usual layouts.
        """
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
            memory, _, cuda = self._memory(region)
            memories.append(memory)
        request = agent_pb2.RegisterTensorRequest(name=name, home_gpu=home_gpu,
                                                  regions=memories, layout=layout)
        return self._register(request, list(regions), cuda, owner_pidfd, watch, readers,
                              writers)

    def _memory(self, tensor):
        """The fuselink.v1.TensorMemory that lends `tensor`, its bytes, and whether it
        is on a GPU."""
        if is_cuda_tensor(tensor):
            handle, offset_bytes, size_bytes, gpu = cuda_ipc_export(tensor)
            return tensor_pb2.TensorMemory(cuda_ipc=tensor_pb2.CudaIpcMemory(
                handle=handle, offset_bytes=offset_bytes, size_bytes=size_bytes,
                gpu=gpu)), size_bytes, True
        size_bytes = _size_of(tensor)  # a TypeError unless a HostBuffer
        return tensor_pb2.TensorMemory(host=tensor_pb2.HostMemory(
            fd_token=send_fd(self.handle_socket, tensor.fd),
            size_bytes=size_bytes)), size_bytes, False

    def _register(self, request, tensors, cuda, owner_pidfd, watch, readers, writers):
        name = request.name
        request.readers.extend(readers or [])
        request.writers.extend(writers or [])
        if owner_pidfd is None:
            owner_pidfd = cuda
        if cuda and not owner_pidfd:
            # The agent takes a CUDA IPC handle only with a token from its handle
            # socket, which proves the lender is a local process (docs/security.md).
            raise ValueError("CUDA tensors are lent with owner_pidfd; the agent "
                             "refuses them without it (OWNER_TOKEN_REQUIRED)")
        if owner_pidfd:
            request.owner_fd_token = send_owner_pidfd(self.handle_socket)

        watcher = self._watch_before_registering(name) if watch else None
        try:
            registered = self._call(self._stub.RegisterTensor, request)
        except BaseException:
            if watcher is not None:
                watcher.close()
            raise
        if watch and watcher is None:
            # An engine may watch only the tensors it owns, so its watch starts once
            # the tensor is registered, still before this call returns: a transfer
            # that whoever it tells next starts cannot finish unseen.
            try:
                watcher = Watch(self._stub, name)
            except BaseException:
                self._call(self._stub.UnregisterTensor,
                           agent_pb2.UnregisterTensorRequest(name=name))
                raise
        with self._lock:
            self._lent[name] = tensors
            if watcher is not None:
                self._watches[name] = watcher
        return registered

    def _watch_before_registering(self, name):
        """A Watch on `name` in place before it is registered, or None where the
        agent refuses a watch on a tensor this client does not own yet (an engine's
        certificate: NOT_FOUND)."""
        try:
            return Watch(self._stub, name)
        except FuselinkError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    def watch(self, tensor="", outgoing=False):
        """A Watch on transfers into `tensor` ("" for all), in place when it returns.

        For tensors not registered here with watch=True: open it, then trigger the
        transfer, then wait() on it. With `outgoing`, the transfers out of `tensor`
        instead, as its source's agent ends them: a prefill engine frees its blocks
        once one completed, and keeps (or recomputes) its `failed_block_ids` when one
        failed (wait() raises FuselinkError with the event in `.event`).
        """
        return Watch(self._stub, tensor, outgoing)

    def wait_for_transfer(self, tensor_name, timeout=None):
        """Waits for a transfer into `tensor_name` to finish; returns its WatchEvent.

        For a tensor registered through this Agent (with watch=True) it returns the
        next transfer that finished since registration or since the previous call, in
        order. For any other tensor it watches from now on, and a transfer that
        finished before this call is not seen: use watch() instead. Raises
        FuselinkError if that transfer failed, TimeoutError after `timeout` seconds.
        """
        with self._lock:
            watcher = self._watches.get(tensor_name)
        if watcher is not None:
            return watcher.wait(timeout)
        with Watch(self._stub, tensor_name) as w:
            return w.wait(timeout)

    def transfer(self, source_tensor, target_node, target_tensor, blocks=None,
                 target_blocks=None, layers=None, request_id=None, timeout=None,
                 on_event=None, layer_by_layer=False, source_node=None, lease_ms=0):
        """Moves blocks of `source_tensor` on this agent's node into `target_tensor` on
        `target_node`, and returns the final fuselink.v1.TransferEvent (`completed`).
        `target_node` may be this node (an in-node move). With `source_node`, the
        source is that node's tensor: this agent forwards the request to that node's
        agent (the decode side pulling) and relays its events; `blocks` must then be
        given, and get_transfer(), cancel(), layers_ready() and extend_lease() name the
        same `source_node` (any agent forwards them to the source's). With `lease_ms`, the
        transfer holds its source only while extend_lease() renews it: one nobody
        renews in time fails DEADLINE_EXCEEDED (LEASE_EXPIRED).

        `blocks` are source block ids (default: every block), copied in every layer
        moved into `target_blocks` (default: the same ids). `layers` is (begin, end)
        or a range; default all. `request_id` makes the call idempotent (default: a
        fresh one). `timeout` bounds the whole transfer, in seconds. `on_event` is
        called with every event (accepted, progress, layer_done, ...). A CUDA source
        must be complete: synchronize the stream that wrote it first. With
        `layer_by_layer`, no layer is sent until layers_ready() says it exists: call
        this from one thread, and layers_ready() with the same `request_id` from the
        one that computes them. Raises
        FuselinkError when the agent refuses the request or the transfer fails (the
        last event seen in `.event`).
        """
        source_node = self.node if source_node is None else source_node
        if blocks is None:
            if source_node != self.node:
                raise ValueError("give blocks when the source is another node's tensor")
            blocks = range(self.get_tensor(source_tensor).layout.blocks_per_layer)
        blocks = list(blocks)
        target_blocks = blocks if target_blocks is None else list(target_blocks)
        request = agent_pb2.TransferRequest(
            request_id=request_id or uuid.uuid4().hex,
            source=agent_pb2.BlockSet(node=source_node, tensor=source_tensor,
                                      block_ids=blocks),
            target=agent_pb2.BlockSet(node=target_node, tensor=target_tensor,
                                      block_ids=target_blocks),
            layer_by_layer=layer_by_layer, lease_ms=lease_ms)
        if layers is not None:
            begin, end = (layers.start, layers.stop) if isinstance(layers, range) else layers
            request.layers.CopyFrom(agent_pb2.LayerRange(begin=begin, end=end))
        last = None
        try:
            for event in self._stub.TransferKVCache(request, timeout=timeout):
                last = event
                if on_event is not None:
                    on_event(event)
        except grpc.RpcError as e:
            failed = last is not None and last.HasField("failed")
            raise from_rpc_error(e, event=last,
                                 default_reason=last.failed.reason if failed else "") from None
        if last is None or not last.HasField("completed"):
            raise FuselinkError(grpc.StatusCode.UNKNOWN,
                                "the transfer stream ended without a final event", event=last)
        return last

    def get_transfer(self, request_id, source_node=""):
        """The fuselink.v1.TransferStatus of transfer `request_id` (this client's).
        `source_node`: the transfer's source when it is not this agent's node (this
        agent asks the source's); the same holds for the calls below."""
        return self._call(self._stub.GetTransfer, agent_pb2.GetTransferRequest(
            request_id=request_id, source_node=source_node))

    def cancel(self, request_id, source_node=""):
        """Cancels transfer `request_id`: it ends CANCELLED once its chunks in flight
        drain. Returns its fuselink.v1.TransferStatus."""
        return self._call(self._stub.CancelTransfer, agent_pb2.CancelTransferRequest(
            request_id=request_id, source_node=source_node))

    def extend_lease(self, request_id, lease_ms=0, source_node=""):
        """Renews the lease of transfer `request_id` (this client's): it now runs out
        `lease_ms` from now (0: its own lease). Returns its fuselink.v1.TransferStatus."""
        return self._call(self._stub.ExtendLease, agent_pb2.ExtendLeaseRequest(
            request_id=request_id, lease_ms=lease_ms, source_node=source_node))

    def layers_ready(self, request_id, ready_end, source_node=""):
        """Tells the layer-by-layer transfer `request_id` (this client's) that its layers
        below `ready_end` exist; they are sent while the rest are computed. Returns
        its fuselink.v1.TransferStatus."""
        return self._call(self._stub.LayersReady, agent_pb2.LayersReadyRequest(
            request_id=request_id, ready_end=ready_end, source_node=source_node))

    def unregister(self, name):
        """Takes the tensor back from the agent and lets go of it here."""
        self._call(self._stub.UnregisterTensor, agent_pb2.UnregisterTensorRequest(name=name))
        with self._lock:
            self._lent.pop(name, None)
            watcher = self._watches.pop(name, None)
        if watcher is not None:
            watcher.close()

    def close(self):
        """Ends the watches and the channel. Lent tensors stay registered."""
        with self._lock:
            watches, self._watches = list(self._watches.values()), {}
        for w in watches:
            w.close()
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
