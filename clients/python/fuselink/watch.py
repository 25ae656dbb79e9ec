"""Watch: the transfers that land on an agent's node, as they finish.

WatchTransfers streams one WatchEvent per finished transfer into this node. The agent
reports only transfers that finish after the watch is in place, and says when it is
in place by sending the call's initial metadata; a Watch returns from its constructor
only then. So: start the watch, then trigger the transfer, then wait.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

import grpc

from fuselink.v1 import agent_pb2

from . import _requests as rq
from ._requests import MAX_PENDING_EVENTS, REFUSAL_WAIT_S, WATCH_READY_KEY
from .errors import FuselinkError, from_rpc_error

__all__ = ["Watch", "MAX_PENDING_EVENTS", "WATCH_READY_KEY"]


class Watch:
    """Transfers into one tensor (or, with tensor "", every tensor) of an agent.

    A background thread reads the stream into a bounded queue; wait() takes events
    from it in the order they finished. Thread-safe. Close it (or use `with`) to end
    the stream.
    """

    def __init__(self, stub, tensor: str = "", outgoing: bool = False) -> None:
        self.tensor = tensor
        self._queue = rq.EventQueue()
        self._cond = threading.Condition()
        self._call = stub.WatchTransfers(
            agent_pb2.WatchTransfersRequest(tensor=tensor, outgoing=outgoing))
        # Returns once the agent has the watch in place (its metadata says so), or the
        # call has failed: a refusal may still be on its way when metadata without the
        # mark returns, so wait for its status then.
        metadata = dict(self._call.initial_metadata() or ())
        if metadata.get(WATCH_READY_KEY) != "1":
            deadline = time.monotonic() + REFUSAL_WAIT_S
            while not self._call.done() and time.monotonic() < deadline:
                time.sleep(0.005)
            if self._call.done():
                raise from_rpc_error(self._call)
            self._call.cancel()  # an agent that does not mark its watches: no promise
            raise rq.watch_not_confirmed()
        self._reader = threading.Thread(target=self._read, name=f"fuselink-watch-{tensor}",
                                        daemon=True)
        self._reader.start()

    def _read(self):
        error = FuselinkError(grpc.StatusCode.UNAVAILABLE, "the agent ended the watch")
        try:
            for event in self._call:
                with self._cond:
                    self._queue.push(event)
                    self._cond.notify_all()
        except grpc.RpcError as e:
            error = from_rpc_error(e)
        with self._cond:
            self._queue.end(error)
            self._cond.notify_all()

    @property
    def dropped_events(self) -> int:
        """Events lost to MAX_PENDING_EVENTS."""
        return self._queue.dropped

    def wait(self, timeout: Optional[float] = None) -> agent_pb2.WatchEvent:
        """The next finished transfer; waits up to `timeout` seconds (None: forever).

        Returns the WatchEvent of a transfer whose bytes all landed. Raises
        FuselinkError for a transfer that failed (its code and message, the event in
        `.event`) or a stream that ended, TimeoutError when none finished in time.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._queue.events:
                if self._queue.error is not None:
                    raise self._queue.error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise rq.watch_timeout(self.tensor, timeout)
                self._cond.wait(remaining)
            event = self._queue.events.popleft()
        return rq.watch_result(event)

    def close(self) -> None:
        """Ends the stream; a wait() in progress raises FuselinkError (CANCELLED)."""
        with self._cond:
            self._queue.end(FuselinkError(grpc.StatusCode.CANCELLED, "watch closed"))
            self._cond.notify_all()
        self._call.cancel()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
