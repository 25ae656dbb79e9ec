"""Watch: the transfers that land on an agent's node, as they finish.

WatchTransfers streams one WatchEvent per finished transfer into this node. The agent
reports only transfers that finish after the watch is in place, and says when it is
in place by sending the call's initial metadata; a Watch returns from its constructor
only then. So: start the watch, then trigger the transfer, then wait.
"""

import collections
import threading
import time

import grpc

from fuselink.v1 import agent_pb2

from .errors import FuselinkError, code_from_int, from_rpc_error

# Finished transfers kept for wait() before the oldest is dropped; an engine that never
# waits must not grow without bound.
MAX_PENDING_EVENTS = 1024
# The initial-metadata entry the agent sends once a watch is in place.
WATCH_READY_KEY = "fuselink-watch-ready"
# How long a watch without that mark waits for the refusal's status to arrive.
_REFUSAL_WAIT_S = 2.0


class Watch:
    """Transfers into one tensor (or, with tensor "", every tensor) of an agent.

    A background thread reads the stream into a bounded queue; wait() takes events
    from it in the order they finished. Thread-safe. Close it (or use `with`) to end
    the stream.
    """

    def __init__(self, stub, tensor="", outgoing=False):
        self.tensor = tensor
        self.dropped_events = 0  # events lost to MAX_PENDING_EVENTS
        self._events = collections.deque()
        self._cond = threading.Condition()
        self._error = None  # why the stream ended, once it has
        self._call = stub.WatchTransfers(
            agent_pb2.WatchTransfersRequest(tensor=tensor, outgoing=outgoing))
        # Returns once the agent has the watch in place (its metadata says so), or the
        # call has failed: a refusal may still be on its way when metadata without the
        # mark returns, so wait for its status then.
        metadata = dict(self._call.initial_metadata() or ())
        if metadata.get(WATCH_READY_KEY) != "1":
            deadline = time.monotonic() + _REFUSAL_WAIT_S
            while not self._call.done() and time.monotonic() < deadline:
                time.sleep(0.005)
            if self._call.done():
                raise from_rpc_error(self._call)
            self._call.cancel()  # an agent that does not mark its watches: no promise
            raise FuselinkError(grpc.StatusCode.FAILED_PRECONDITION,
                                "the agent did not confirm the watch is in place")
        self._reader = threading.Thread(target=self._read, name=f"fuselink-watch-{tensor}",
                                        daemon=True)
        self._reader.start()

    def _read(self):
        error = FuselinkError(grpc.StatusCode.UNAVAILABLE, "the agent ended the watch")
        try:
            for event in self._call:
                with self._cond:
                    if len(self._events) == MAX_PENDING_EVENTS:
                        self._events.popleft()
                        self.dropped_events += 1
                    self._events.append(event)
                    self._cond.notify_all()
        except grpc.RpcError as e:
            error = from_rpc_error(e)
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    def wait(self, timeout=None):
        """The next finished transfer; waits up to `timeout` seconds (None: forever).

        Returns the WatchEvent of a transfer whose bytes all landed. Raises
        FuselinkError for a transfer that failed (its code and message, the event in
        `.event`) or a stream that ended, TimeoutError when none finished in time.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._events:
                if self._error is not None:
                    raise self._error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    what = self.tensor or "any tensor"
                    raise TimeoutError(f"no transfer into {what} finished in {timeout} s")
                self._cond.wait(remaining)
            event = self._events.popleft()
        if event.code != 0:
            raise FuselinkError(code_from_int(event.code), event.message, event=event)
        return event

    def close(self):
        """Ends the stream; a wait() in progress raises FuselinkError (CANCELLED)."""
        with self._cond:
            if self._error is None:
                self._error = FuselinkError(grpc.StatusCode.CANCELLED, "watch closed")
            self._cond.notify_all()
        self._call.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
