"""Python client of the fuselink agent: lend KV caches, move them, wait for them.

The generated protobuf and gRPC modules live beside this package, in fuselink.v1
(agent_pb2, tensor_pb2, ...) and google.rpc; the build writes all of them to
build/python (see clients/python/README.md).
"""

from . import reasons
from .client import DEFAULT_CALL_TIMEOUT_S, Agent, Part
from .errors import FuselinkError
from .memory import HostBuffer
from .tls import Tls
from .watch import MAX_PENDING_EVENTS, Watch

__all__ = ["Agent", "Part", "FuselinkError", "HostBuffer", "Tls", "Watch", "DEFAULT_CALL_TIMEOUT_S",
           "MAX_PENDING_EVENTS", "reasons"]
