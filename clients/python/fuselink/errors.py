"""FuselinkError: one exception for every failure the agent reports.

The agent answers every failed call with a gRPC status code and, in the status
details (trailing metadata `grpc-status-details-bin`), a google.rpc.Status holding a
google.rpc.ErrorInfo whose `reason` names the cause in machine-readable form, e.g.
NOT_FOUND / UNKNOWN_TENSOR. Callers branch on `code` and `reason`, never on the text.
fuselink.reasons names every reason (docs/errors.md says what each means).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import grpc
from google.protobuf.message import DecodeError

from ._rpc import error_details_pb2, status_pb2  # generated (protogen.py)

# grpc.StatusCode by its integer value (absl and google.rpc number codes the same).
_CODES = {code.value[0]: code for code in grpc.StatusCode}

_DETAILS_KEY = "grpc-status-details-bin"


class FuselinkError(Exception):
    """A call the agent refused or a transfer that failed.

    Attributes:
      code: a grpc.StatusCode (what the caller should do: UNAVAILABLE retry,
        INVALID_ARGUMENT / NOT_FOUND / OUT_OF_RANGE fix the request, ...).
      reason: the ErrorInfo reason, e.g. "UNKNOWN_TENSOR"; "" when the agent gave none
        (or the failure came from gRPC itself, e.g. an unreachable agent).
      message: the agent's human-readable text.
      metadata: the ErrorInfo's metadata map (often empty).
      event: for a failed transfer, the last TransferEvent or WatchEvent seen; else None.
    """

    def __init__(self, code: grpc.StatusCode, message: str, reason: str = "",
                 metadata: Optional[Mapping[str, str]] = None, event: Any = None) -> None:
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = dict(metadata or {})
        self.event = event
        label = f"{code.name} {reason}" if reason else code.name
        super().__init__(f"{label}: {message}")


def code_from_int(value: int) -> grpc.StatusCode:
    """The grpc.StatusCode numbered `value`; UNKNOWN for a number gRPC does not know."""
    return _CODES.get(value, grpc.StatusCode.UNKNOWN)


def from_rpc_error(error: grpc.RpcError, event: Any = None,
                   default_reason: str = "") -> FuselinkError:
    """Turns a grpc.RpcError into a FuselinkError, reading the ErrorInfo if present
    (`default_reason` when there is none)."""
    code = error.code() or grpc.StatusCode.UNKNOWN
    message = error.details() or ""
    reason, metadata = default_reason, {}
    for key, value in error.trailing_metadata() or ():
        if key != _DETAILS_KEY:
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value)
        except DecodeError:  # a malformed detail must not hide the error itself
            break
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Is(info.DESCRIPTOR) and detail.Unpack(info) and info.reason:
                reason, metadata = info.reason, info.metadata
                break
    return FuselinkError(code, message, reason, metadata, event)
