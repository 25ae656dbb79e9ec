"""fuselink.aio: the client for asyncio programs (a router under FastAPI or uvloop).

The same calls as fuselink.Agent, as coroutines on grpc's asyncio API (grpc.aio), so
one event loop runs many transfers and watches at once without a thread each:

    agent = fuselink.aio.Agent("10.0.0.1:50051", tls=router_tls)
    async for event in agent.transfer("kv0", "node-b", "kv0", blocks=[3, 4]):
        print(event)                     # accepted, progress, ..., completed
    done = await agent.transfer("kv0", "node-b", "kv0")     # only the final event

The requests, the error mapping (FuselinkError) and the TLS files are the
synchronous client's (_requests.py, errors.py, tls.py). Lending memory passes
descriptors over the agent's Unix handle socket (memory.py): that stays a short
blocking exchange, run on the loop's default executor so the loop never waits on it.
An Agent belongs to the event loop it was made in; it is not thread-safe.
"""

from __future__ import annotations

import asyncio
import functools
from typing import AsyncIterator, Iterable, Optional, Sequence

import grpc
import grpc.aio

from fuselink.v1 import agent_pb2, agent_pb2_grpc, tensor_pb2, topology_pb2

from . import _requests as rq
from ._requests import DEFAULT_CALL_TIMEOUT_S, Lendable, Layers, Part
from .errors import FuselinkError, from_rpc_error
from .tls import Tls, open_channel

__all__ = ["Agent", "Transfer", "Watch", "Part"]


class Watch:
    """Transfers into one tensor (or, with tensor "", every tensor) of an agent, as
    they finish. Made by Agent.watch(); in place once awaited (or entered with
    `async with`), so: open it, then trigger the transfer, then wait.

    `async for event in watch` gives every WatchEvent, failed ones too (`code` != 0),
    until the watch is closed; wait() gives the next one that landed and raises
    FuselinkError for one that failed. A task reads the stream into a queue of at
    most MAX_PENDING_EVENTS, the oldest dropped first (`dropped_events`).
    """

    def __init__(self, stub, tensor: str = "", outgoing: bool = False) -> None:
        self.tensor = tensor
        self._request = agent_pb2.WatchTransfersRequest(tensor=tensor, outgoing=outgoing)
        self._stub = stub
        self._call = None
        self._reader: Optional[asyncio.Task] = None
        self._queue = rq.EventQueue()
        self._changed = asyncio.Condition()

    @property
    def dropped_events(self) -> int:
        return self._queue.dropped

    async def _open(self) -> "Watch":
        if self._call is not None:
            return self
        self._call = self._stub.WatchTransfers(self._request)
        metadata = await self._call.initial_metadata()  # a grpc.aio.Metadata
        if (metadata.get(rq.WATCH_READY_KEY) if metadata else None) != "1":
            # No mark: a refusal, whose status may still be on its way, or an agent
            # that does not mark its watches (no promise, so no watch).
            try:
                code = await asyncio.wait_for(self._call.code(), rq.REFUSAL_WAIT_S)
            except asyncio.TimeoutError:
                self._call.cancel()
                raise rq.watch_not_confirmed() from None
            raise from_rpc_error(grpc.aio.AioRpcError(
                code, await self._call.initial_metadata(),
                await self._call.trailing_metadata(), await self._call.details()))
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return self

    def __await__(self):
        return self._open().__await__()

    async def _read(self) -> None:
        error = FuselinkError(grpc.StatusCode.UNAVAILABLE, "the agent ended the watch")
        try:
            async for event in self._call:
                async with self._changed:
                    self._queue.push(event)
                    self._changed.notify_all()
        except grpc.RpcError as e:
            error = from_rpc_error(e)
        except asyncio.CancelledError:
            error = FuselinkError(grpc.StatusCode.CANCELLED, "watch closed")
        async with self._changed:
            self._queue.end(error)
            self._changed.notify_all()

    async def _next(self, timeout: Optional[float]):
        """The next WatchEvent, landed or failed."""
        await self._open()

        async def ready():
            async with self._changed:
                await self._changed.wait_for(
                    lambda: self._queue.events or self._queue.error is not None)
                if self._queue.events:
                    return self._queue.events.popleft()
                raise self._queue.error

        try:
            return await asyncio.wait_for(ready(), timeout)
        except asyncio.TimeoutError:
            raise rq.watch_timeout(self.tensor, timeout) from None

    async def wait(self, timeout: Optional[float] = None) -> agent_pb2.WatchEvent:
        """The next finished transfer, within `timeout` seconds (None: forever): its
        WatchEvent if its bytes all landed. Raises FuselinkError for one that failed
        (the event in `.event`) or a stream that ended, TimeoutError after `timeout`."""
        return rq.watch_result(await self._next(timeout))

    def __aiter__(self) -> AsyncIterator[agent_pb2.WatchEvent]:
        return self

    async def __anext__(self) -> agent_pb2.WatchEvent:
        try:
            return await self._next(None)
        except FuselinkError as e:
            if e.code == grpc.StatusCode.CANCELLED and self._call is not None \
                    and self._call.cancelled():
                raise StopAsyncIteration from None
            raise

    async def close(self) -> None:
        """Ends the stream; a wait() in progress raises FuselinkError (CANCELLED)."""
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        async with self._changed:
            self._queue.end(FuselinkError(grpc.StatusCode.CANCELLED, "watch closed"))
            self._changed.notify_all()

    async def __aenter__(self) -> "Watch":
        return await self._open()

    async def __aexit__(self, *exc) -> None:
        await self.close()


class Transfer:
    """One TransferKVCache call: `async for event in transfer` streams its events
    (accepted, progress, layer_done, ..., completed), `await transfer` returns only
    the final one. Either raises FuselinkError when the agent refuses the request or
    the transfer fails (the last event seen in `.event`). The call starts on the first
    iteration or await, once; `request_id` is known before that, for cancel() or
    layers_ready() from another task. Leaving the loop early stops listening, not the
    transfer: Agent.cancel() stops it.
    """

    def __init__(self, agent: "Agent", request_args: dict, timeout: Optional[float]) -> None:
        self._agent = agent
        self._args = request_args
        self._timeout = timeout
        self._started = False
        self.request_id: str = request_args["request_id"]
        self.final: Optional[agent_pb2.TransferEvent] = None  # once completed

    def __aiter__(self) -> AsyncIterator[agent_pb2.TransferEvent]:
        if self._started:
            raise RuntimeError(f"transfer {self.request_id} is already running")
        self._started = True
        return self._events()

    async def _events(self) -> AsyncIterator[agent_pb2.TransferEvent]:
        args, agent = self._args, self._agent
        node = await agent.node()
        if args["source_node"] is None:
            args["source_node"] = node
        rq.check_transfer_blocks(args["blocks"], args["source_node"], node)
        if args["blocks"] is None:
            tensor = await agent.get_tensor(args["source_tensor"])
            args["blocks"] = range(tensor.layout.blocks_per_layer)
        call = agent._stub.TransferKVCache(rq.transfer_request(**args), timeout=self._timeout)
        last = None
        try:
            async for event in call:
                last = event
                yield event
        except grpc.RpcError as e:
            raise rq.stream_failed(e, last) from None
        finally:
            call.cancel()  # no-op once it ended; stops the stream of a loop left early
        self.final = rq.final_event(last)

    async def _run(self) -> agent_pb2.TransferEvent:
        async for _ in self:
            pass
        return self.final

    def __await__(self):
        return self._run().__await__()


class Agent:
    """A grpc.aio channel to one agent, and the memory this program lent through it.

    The arguments and the methods are fuselink.Agent's (see there for what each
    does), each a coroutine, with these differences: register_*(watch=True) starts
    its watch right after registering, never before; `node()` and `handle_socket()`
    are coroutines, not properties; transfer() returns a Transfer (iterate it or
    await it; no on_event); watch() returns a Watch to await or enter with `async
    with`. Use it from the event loop it was made in.
    """

    def __init__(self, address: str, handle_socket: Optional[str] = None,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, *, tls: Optional[Tls] = None,
                 plaintext: bool = False) -> None:
        self.address = address
        self._handle_socket = handle_socket
        self._call_timeout_s = call_timeout_s
        self._channel = open_channel(grpc.aio, address, tls, plaintext)
        self._stub = agent_pb2_grpc.AgentStub(self._channel)
        self._node: Optional[str] = None
        self._lent = {}  # tensor name -> the objects whose memory the agent maps
        self._watches = {}  # tensor name -> Watch started at registration

    async def _call(self, method, request):
        try:
            return await method(request, timeout=self._call_timeout_s)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def node(self) -> str:
        """The agent's node name (its --node), asked once."""
        if self._node is None:
            self._node = (await self.topology()).node
        return self._node

    async def handle_socket(self) -> str:
        """The path given, else the agent's default for its node."""
        return self._handle_socket or rq.handle_socket_of(await self.node())

    async def topology(self) -> topology_pb2.Topology:
        return await self._call(self._stub.GetTopology, agent_pb2.GetTopologyRequest())

    async def get_tensor(self, name: str) -> tensor_pb2.Tensor:
        return await self._call(self._stub.GetTensor, agent_pb2.GetTensorRequest(name=name))

    async def register_kv_cache(self, name: str, tensor: Lendable, layers: int,
                                blocks_per_layer: int, block_bytes: Optional[int] = None, *,
                                block_stride_bytes: int = 0, layer_stride_bytes: int = 0,
                                home_gpu: int = 0, owner_pidfd: Optional[bool] = None,
                                watch: bool = True, readers: Optional[Iterable[str]] = None,
                                writers: Optional[Iterable[str]] = None) -> tensor_pb2.Tensor:
        build = functools.partial(
            rq.kv_cache_registration, name, tensor, layers, blocks_per_layer, block_bytes,
            block_stride_bytes, layer_stride_bytes, home_gpu)
        return await self._register(build, rq.Grants(owner_pidfd, readers, writers), watch)

    async def register_kv_layers(self, name: str, layers: Sequence, blocks_per_layer: int, *,
                                 part_bytes: Optional[int] = None, home_gpu: int = 0,
                                 owner_pidfd: Optional[bool] = None, watch: bool = True,
                                 readers: Optional[Iterable[str]] = None,
                                 writers: Optional[Iterable[str]] = None) -> tensor_pb2.Tensor:
        regions, parts = rq.kv_layers_parts(layers, blocks_per_layer, part_bytes)
        return await self.register_kv_parts(name, regions, blocks_per_layer, parts,
                                            home_gpu=home_gpu, owner_pidfd=owner_pidfd,
                                            watch=watch, readers=readers, writers=writers)

    async def register_kv_parts(self, name: str, regions: Sequence[Lendable],
                                blocks_per_layer: int, parts: Sequence[Sequence[Part]], *,
                                home_gpu: int = 0, owner_pidfd: Optional[bool] = None,
                                watch: bool = True, readers: Optional[Iterable[str]] = None,
                                writers: Optional[Iterable[str]] = None) -> tensor_pb2.Tensor:
        build = functools.partial(rq.kv_parts_registration, name, regions,
                                  blocks_per_layer, parts, home_gpu)
        return await self._register(build, rq.Grants(owner_pidfd, readers, writers), watch)

    async def _register(self, build, grants: rq.Grants, watch: bool) -> tensor_pb2.Tensor:
        """Sends build(handle_socket, grants)'s registration, made off the loop: its
        descriptors pass over the handle socket."""
        socket = await self.handle_socket()
        registration = await asyncio.get_running_loop().run_in_executor(
            None, build, lambda: socket, grants)
        name = registration.request.name
        registered = await self._call(self._stub.RegisterTensor, registration.request)
        self._lent[name] = registration.tensors
        if watch:
            # Right after registering (an engine may watch only the tensors it owns),
            # in place before this returns: no transfer started later goes unseen.
            try:
                self._watches[name] = await Watch(self._stub, name)
            except BaseException:
                await self.unregister(name)
                raise
        return registered

    def watch(self, tensor: str = "", outgoing: bool = False) -> Watch:
        """A Watch on transfers into `tensor` ("" for all), or with `outgoing` out of
        it; in place once awaited: `w = await agent.watch("kv0")` or `async with
        agent.watch("kv0") as w:`."""
        return Watch(self._stub, tensor, outgoing)

    async def wait_for_transfer(self, tensor_name: str,
                                timeout: Optional[float] = None) -> agent_pb2.WatchEvent:
        watcher = self._watches.get(tensor_name)
        if watcher is not None:
            return await watcher.wait(timeout)
        async with self.watch(tensor_name) as w:
            return await w.wait(timeout)

    def transfer(self, source_tensor: str, target_node: str, target_tensor: str,
                 blocks: Optional[Iterable[int]] = None,
                 target_blocks: Optional[Iterable[int]] = None,
                 layers: Optional[Layers] = None, request_id: Optional[str] = None,
                 timeout: Optional[float] = None, layer_by_layer: bool = False,
                 source_node: Optional[str] = None, lease_ms: int = 0) -> Transfer:
        """A Transfer of blocks of `source_tensor` into `target_tensor` on
        `target_node`; fuselink.Agent.transfer's arguments, checked when it starts."""
        args = dict(source_node=source_node, source_tensor=source_tensor, blocks=blocks,
                    target_node=target_node, target_tensor=target_tensor,
                    target_blocks=target_blocks, layers=layers,
                    request_id=request_id or rq.new_request_id(),
                    layer_by_layer=layer_by_layer, lease_ms=lease_ms)
        return Transfer(self, args, timeout)

    async def get_transfer(self, request_id: str,
                           source_node: str = "") -> agent_pb2.TransferStatus:
        return await self._on_transfer("GetTransfer", request_id, source_node)

    async def cancel(self, request_id: str, source_node: str = "") -> agent_pb2.TransferStatus:
        return await self._on_transfer("CancelTransfer", request_id, source_node)

    async def extend_lease(self, request_id: str, lease_ms: int = 0,
                           source_node: str = "") -> agent_pb2.TransferStatus:
        return await self._on_transfer("ExtendLease", request_id, source_node,
                                       lease_ms=lease_ms)

    async def layers_ready(self, request_id: str, ready_end: int,
                           source_node: str = "") -> agent_pb2.TransferStatus:
        return await self._on_transfer("LayersReady", request_id, source_node,
                                       ready_end=ready_end)

    async def _on_transfer(self, method: str, request_id: str, source_node: str, **fields):
        return await self._call(getattr(self._stub, method),
                                rq.transfer_call(method, request_id, source_node, **fields))

    async def unregister(self, name: str) -> None:
        await self._call(self._stub.UnregisterTensor,
                         agent_pb2.UnregisterTensorRequest(name=name))
        self._lent.pop(name, None)
        watcher = self._watches.pop(name, None)
        if watcher is not None:
            await watcher.close()

    async def close(self) -> None:
        """Ends the watches and the channel. Lent tensors stay registered."""
        watches, self._watches = list(self._watches.values()), {}
        for w in watches:
            await w.close()
        await self._channel.close()

    async def __aenter__(self) -> "Agent":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
