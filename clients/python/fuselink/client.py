"""Agent: a connection to one fuselink agent, for engines and orchestrators.

An engine lends a KV cache (a PyTorch CUDA tensor or a HostBuffer) and waits for the
transfers that land in it; an orchestrator asks the source node's agent to move
blocks. Every failed call raises FuselinkError with the agent's code and reason.

    agent = fuselink.Agent("127.0.0.1:50051",
                           tls=fuselink.Tls.from_dir("certs", "engine", "e1"))
    agent.register_kv_cache("kv0", kv_cache, layers=32, blocks_per_layer=64)
    event = agent.wait_for_transfer("kv0", timeout=60)
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable, Optional, Sequence

import grpc

from fuselink.v1 import agent_pb2, agent_pb2_grpc, tensor_pb2, topology_pb2

from . import _requests as rq
from ._requests import DEFAULT_CALL_TIMEOUT_S, Lendable, Layers, Part
from .errors import FuselinkError, from_rpc_error
from .tls import Tls, open_channel
from .watch import Watch

__all__ = ["Agent", "Part", "DEFAULT_CALL_TIMEOUT_S"]


class Agent:
    """A gRPC channel to one agent, and the memory this process lent through it.

    `address` is the agent's gRPC address (host:port). `handle_socket` is its Unix
    handle socket, needed to lend memory (default: the agent's own default,
    /run/fuselink/<node>.sock). The Agent keeps every lent tensor alive until it is
    unregistered, so PyTorch cannot hand its memory to another tensor while the agent
    still maps it. Closing the Agent does not unregister anything. Safe to share
    between threads.
    """

    def __init__(self, address: str, handle_socket: Optional[str] = None,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, *, tls: Optional[Tls] = None,
                 plaintext: bool = False) -> None:
        """`tls` (a fuselink.Tls) is the certificate this client speaks as; without
        it, `plaintext=True` must say that the agent runs with --plaintext. ValueError
        when neither or both are given."""
        self.address = address
        self._handle_socket = handle_socket
        self._call_timeout_s = call_timeout_s
        self._channel = open_channel(grpc, address, tls, plaintext)
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
    def node(self) -> str:
        """The agent's node name (its --node), asked once."""
        if self._node is None:
            self._node = self.topology().node
        return self._node

    @property
    def handle_socket(self) -> str:
        """The path given, else the agent's default for its node."""
        return self._handle_socket or rq.handle_socket_of(self.node)

    def _socket(self) -> str:
        return self.handle_socket

    def topology(self) -> topology_pb2.Topology:
        """The agent's fuselink.v1.Topology: its node name, GPUs and NICs."""
        return self._call(self._stub.GetTopology, agent_pb2.GetTopologyRequest())

    def get_tensor(self, name: str) -> tensor_pb2.Tensor:
        """The agent's fuselink.v1.Tensor named `name` (NOT_FOUND if none)."""
        return self._call(self._stub.GetTensor, agent_pb2.GetTensorRequest(name=name))

    def register_kv_cache(self, name: str, tensor: Lendable, layers: int,
                          blocks_per_layer: int, block_bytes: Optional[int] = None, *,
                          block_stride_bytes: int = 0, layer_stride_bytes: int = 0,
                          home_gpu: int = 0, owner_pidfd: Optional[bool] = None,
                          watch: bool = True, readers: Optional[Iterable[str]] = None,
                          writers: Optional[Iterable[str]] = None) -> tensor_pb2.Tensor:
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
        registration = rq.kv_cache_registration(
            name, tensor, layers, blocks_per_layer, block_bytes, block_stride_bytes,
            layer_stride_bytes, home_gpu, self._socket,
            rq.Grants(owner_pidfd, readers, writers))
        return self._register(registration, watch)

    def register_kv_layers(self, name: str, layers: Sequence, blocks_per_layer: int, *,
                           part_bytes: Optional[int] = None, home_gpu: int = 0,
                           owner_pidfd: Optional[bool] = None, watch: bool = True,
                           readers: Optional[Iterable[str]] = None,
                           writers: Optional[Iterable[str]] = None) -> tensor_pb2.Tensor:
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
        regions, parts = rq.kv_layers_parts(layers, blocks_per_layer, part_bytes)
        return self.register_kv_parts(name, regions, blocks_per_layer, parts,
                                      home_gpu=home_gpu, owner_pidfd=owner_pidfd,
                                      watch=watch, readers=readers, writers=writers)

    def register_kv_parts(self, name: str, regions: Sequence[Lendable],
                          blocks_per_layer: int, parts: Sequence[Sequence[Part]], *,
                          home_gpu: int = 0, owner_pidfd: Optional[bool] = None,
                          watch: bool = True, readers: Optional[Iterable[str]] = None,
                          writers: Optional[Iterable[str]] = None) -> tensor_pb2.Tensor:
        """Lends a KV cache of any layout of parts (fuselink.v1.Layout): `regions` are
        the tensors or HostBuffers it lies in, `parts[l]` the list of fuselink.Part
        that make up every block of layer l, in order (the same number in each layer).
        Part(region, offset_bytes, bytes, block_stride_bytes=0) says block b's part is
        `bytes` at offset_bytes + b * block_stride_bytes (0: bytes) of regions[region].
        register_kv_layers is this for the engines' usual layouts.
        """
        registration = rq.kv_parts_registration(
            name, regions, blocks_per_layer, parts, home_gpu, self._socket,
            rq.Grants(owner_pidfd, readers, writers))
        return self._register(registration, watch)

    def _register(self, registration: rq.Registration, watch: bool) -> tensor_pb2.Tensor:
        name = registration.request.name
        watcher = self._watch_before_registering(name) if watch else None
        try:
            registered = self._call(self._stub.RegisterTensor, registration.request)
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
            self._lent[name] = registration.tensors
            if watcher is not None:
                self._watches[name] = watcher
        return registered

    def _watch_before_registering(self, name: str) -> Optional[Watch]:
        """A Watch on `name` in place before it is registered, or None where the
        agent refuses a watch on a tensor this client does not own yet (an engine's
        certificate: NOT_FOUND)."""
        try:
            return Watch(self._stub, name)
        except FuselinkError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    def watch(self, tensor: str = "", outgoing: bool = False) -> Watch:
        """A Watch on transfers into `tensor` ("" for all), in place when it returns.

        For tensors not registered here with watch=True: open it, then trigger the
        transfer, then wait() on it. With `outgoing`, the transfers out of `tensor`
        instead, as its source's agent ends them: a prefill engine frees its blocks
        once one completed, and keeps (or recomputes) its `failed_block_ids` when one
        failed (wait() raises FuselinkError with the event in `.event`).
        """
        return Watch(self._stub, tensor, outgoing)

    def wait_for_transfer(self, tensor_name: str,
                          timeout: Optional[float] = None) -> agent_pb2.WatchEvent:
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

    def transfer(self, source_tensor: str, target_node: str, target_tensor: str,
                 blocks: Optional[Iterable[int]] = None,
                 target_blocks: Optional[Iterable[int]] = None,
                 layers: Optional[Layers] = None, request_id: Optional[str] = None,
                 timeout: Optional[float] = None,
                 on_event: Optional[Callable[[agent_pb2.TransferEvent], None]] = None,
                 layer_by_layer: bool = False, source_node: Optional[str] = None,
                 lease_ms: int = 0) -> agent_pb2.TransferEvent:
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
        rq.check_transfer_blocks(blocks, source_node, self.node)
        if blocks is None:
            blocks = range(self.get_tensor(source_tensor).layout.blocks_per_layer)
        request = rq.transfer_request(source_node, source_tensor, blocks, target_node,
                                      target_tensor, target_blocks, layers, request_id,
                                      layer_by_layer, lease_ms)
        last = None
        try:
            for event in self._stub.TransferKVCache(request, timeout=timeout):
                last = event
                if on_event is not None:
                    on_event(event)
        except grpc.RpcError as e:
            raise rq.stream_failed(e, last) from None
        return rq.final_event(last)

    def get_transfer(self, request_id: str, source_node: str = "") -> agent_pb2.TransferStatus:
        """The fuselink.v1.TransferStatus of transfer `request_id` (this client's).
        `source_node`: the transfer's source when it is not this agent's node (this
        agent asks the source's); the same holds for the calls below."""
        return self._on_transfer("GetTransfer", request_id, source_node)

    def cancel(self, request_id: str, source_node: str = "") -> agent_pb2.TransferStatus:
        """Cancels transfer `request_id`: it ends CANCELLED once its chunks in flight
        drain. Returns its fuselink.v1.TransferStatus."""
        return self._on_transfer("CancelTransfer", request_id, source_node)

    def extend_lease(self, request_id: str, lease_ms: int = 0,
                     source_node: str = "") -> agent_pb2.TransferStatus:
        """Renews the lease of transfer `request_id` (this client's): it now runs out
        `lease_ms` from now (0: its own lease). Returns its fuselink.v1.TransferStatus."""
        return self._on_transfer("ExtendLease", request_id, source_node, lease_ms=lease_ms)

    def layers_ready(self, request_id: str, ready_end: int,
                     source_node: str = "") -> agent_pb2.TransferStatus:
        """Tells the layer-by-layer transfer `request_id` (this client's) that its layers
        below `ready_end` exist; they are sent while the rest are computed. Returns
        its fuselink.v1.TransferStatus."""
        return self._on_transfer("LayersReady", request_id, source_node, ready_end=ready_end)

    def _on_transfer(self, method: str, request_id: str, source_node: str, **fields):
        return self._call(getattr(self._stub, method),
                          rq.transfer_call(method, request_id, source_node, **fields))

    def unregister(self, name: str) -> None:
        """Takes the tensor back from the agent and lets go of it here."""
        self._call(self._stub.UnregisterTensor, agent_pb2.UnregisterTensorRequest(name=name))
        with self._lock:
            self._lent.pop(name, None)
            watcher = self._watches.pop(name, None)
        if watcher is not None:
            watcher.close()

    def close(self) -> None:
        """Ends the watches and the channel. Lent tensors stay registered."""
        with self._lock:
            watches, self._watches = list(self._watches.values()), {}
        for w in watches:
            w.close()
        self._channel.close()

    def __enter__(self) -> "Agent":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
