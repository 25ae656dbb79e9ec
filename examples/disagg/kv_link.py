"""How a prefill engine's KV blocks reach the decode engine, and how the decode engine
learns that they landed.

Both engines see only two things: a `send(request_id, source_blocks, target_node,
target_tensor, target_blocks)` callable on the prefill side, which returns once the
blocks have landed and raises TransferFailed otherwise, and an Arrivals on the decode
side. Through fuselink, send is one agent.transfer() call and Arrivals is fed by the
decode engine's watch on its own tensor (follow_watch). In-process (LocalLink, for
tests without agents) send copies the blocks between the two caches and tells the
Arrivals itself. Nothing else differs between the two paths.
"""

import collections
import threading
import time

# Landed transfers waiting for their /generate before the oldest is dropped: a decode
# engine whose router gave up on a request must not grow without bound.
MAX_PENDING_ARRIVALS = 1024


class TransferFailed(Exception):
    """The KV blocks of a request did not land; `cause` is the agent's error, if any."""

    def __init__(self, message, cause=None):
        super().__init__(message)
        self.cause = cause


class Arrivals:
    """Transfers that finished into one engine's cache, keyed by the block ids they
    filled. Between allocate and free a block belongs to one request, so the ids name
    the request; allocate calls forget() so that a transfer that landed in the same
    blocks for an earlier request is never taken for this one's. Thread-safe."""

    def __init__(self):
        self._cond = threading.Condition()
        self._landed = collections.OrderedDict()  # tuple(block ids) -> error or None
        self._closed = None  # why no more arrivals will be seen, once that is so
        self.dropped = 0  # arrivals lost to MAX_PENDING_ARRIVALS

    def landed(self, block_ids, error=None):
        """Records a finished transfer into `block_ids`; `error` when it failed."""
        with self._cond:
            if len(self._landed) == MAX_PENDING_ARRIVALS:
                self._landed.popitem(last=False)
                self.dropped += 1
            self._landed[tuple(block_ids)] = error
            self._cond.notify_all()

    def forget(self, block_ids):
        """Drops every recorded arrival that touched any of `block_ids`."""
        ids = set(block_ids)
        with self._cond:
            for key in [k for k in self._landed if ids.intersection(k)]:
                del self._landed[key]

    def close(self, error):
        """No arrival will be recorded any more: waits in progress and later ones
        raise TransferFailed with `error` as its cause."""
        with self._cond:
            if self._closed is None:
                self._closed = error
            self._cond.notify_all()

    def wait(self, block_ids, timeout_s):
        """Returns once a transfer into exactly `block_ids` has landed (and forgets
        it). Raises TransferFailed if it failed or no more can be seen, TimeoutError
        after `timeout_s` seconds."""
        key = tuple(block_ids)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while key not in self._landed:
                if self._closed is not None:
                    raise TransferFailed(f"no more transfers can be seen: {self._closed}",
                                         self._closed)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no transfer into blocks {list(key)} landed in "
                                       f"{timeout_s} s")
                self._cond.wait(remaining)
            error = self._landed.pop(key)
        if error is not None:
            raise TransferFailed(f"the transfer into blocks {list(key)} failed: {error}", error)


def follow_watch(watch, arrivals):
    """Feeds `arrivals` from `watch` (a fuselink.Watch on the engine's own tensor)
    until it ends, then closes `arrivals`. Runs in its own thread; returns once the
    watch is closed."""
    import fuselink

    while True:
        try:
            event = watch.wait()
        except fuselink.FuselinkError as e:
            if e.event is not None:  # one transfer failed; the watch goes on
                arrivals.landed(e.event.block_ids, error=e)
                continue
            arrivals.close(e)
            return
        arrivals.landed(event.block_ids)


class AgentSender:
    """send() through fuselink: the prefill node's agent moves the blocks, in every
    layer, K and V parts both, into the decode engine's tensor on `target_node`."""

    def __init__(self, router_agent, source_tensor, timeout_s):
        self._agent = router_agent
        self._source_tensor = source_tensor
        self._timeout_s = timeout_s

    def __call__(self, request_id, source_blocks, target_node, target_tensor, target_blocks):
        import fuselink

        try:
            # No request_id: a retried /prefill computes into fresh blocks, so it is a
            # new transfer, never the old one's answer.
            self._agent.transfer(self._source_tensor, target_node, target_tensor,
                                 blocks=source_blocks, target_blocks=target_blocks,
                                 timeout=self._timeout_s)
        except fuselink.FuselinkError as e:
            raise TransferFailed(f"request {request_id}: {e}", e) from None


    def layers_ready(self, request_id, layers):
        """Tells the agent that layers below `layers` of the layer-by-layer transfer
        `request_id` (this identity's, started by this engine or by the router) are
        computed. The transfer may not have reached the agent yet: retried briefly."""
        import fuselink

        deadline = time.monotonic() + 5
        while True:
            try:
                self._agent.layers_ready(request_id, layers)
                return
            except fuselink.FuselinkError as e:
                if e.reason != "UNKNOWN_TRANSFER" or time.monotonic() > deadline:
                    raise TransferFailed(f"layers ready: {e}", e) from None
                time.sleep(0.001)

    def start(self, source_blocks, target_node, target_tensor, target_blocks):
        """The same transfer, layer by layer: started now, sent as ready() tells each
        layer computed; wait() returns once it completed."""
        return LayeredTransfer(self, source_blocks, target_node, target_tensor,
                               target_blocks)


class LayeredTransfer:
    """One layer-by-layer transfer: TransferKVCache runs on a thread of its own while
    the prefill computes, and LayersReady tells the agent each layer that is done."""

    def __init__(self, sender, source_blocks, target_node, target_tensor, target_blocks):
        import uuid

        self._sender = sender
        self._agent = sender._agent
        self._request_id = uuid.uuid4().hex
        self._error = None

        def run():
            import fuselink

            try:
                self._agent.transfer(sender._source_tensor, target_node, target_tensor,
                                     blocks=source_blocks, target_blocks=target_blocks,
                                     request_id=self._request_id, layer_by_layer=True,
                                     timeout=sender._timeout_s)
            except fuselink.FuselinkError as e:
                self._error = e

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def ready(self, layers):
        """Layers below `layers` are computed (and, on a GPU, synchronized)."""
        self._sender.layers_ready(self._request_id, layers)

    def wait(self, request_id):
        self._thread.join()
        if self._error is not None:
            raise TransferFailed(f"request {request_id}: {self._error}", self._error)


class LocalLink:
    """send() in one process, standing in for the agents: copies the blocks' bytes
    from `source_cache` into `target_cache` (model.PagedKvCache objects) and records
    the arrival in `arrivals`, as the decode engine's watch would."""

    def __init__(self, source_cache, target_cache, target_tensor, arrivals):
        self._source = source_cache
        self._target = target_cache
        self._target_tensor = target_tensor
        self._arrivals = arrivals

    def __call__(self, request_id, source_blocks, target_node, target_tensor, target_blocks):
        if target_tensor != self._target_tensor:
            raise TransferFailed(f"request {request_id}: no tensor {target_tensor!r}")
        self._source.copy_blocks(source_blocks, self._target, target_blocks)
        self._arrivals.landed(target_blocks)
