"""Python client of the fuselink agent: lend KV caches, move them, wait for them.

fuselink.Agent is the synchronous client; fuselink.aio.Agent the same calls for
asyncio programs. The generated protobuf and gRPC modules are fuselink.v1 (agent_pb2,
tensor_pb2, ...); a wheel's build writes them (protogen.py), as the CMake build does
into build/python (see clients/python/README.md).
"""

from . import reasons
from .client import DEFAULT_CALL_TIMEOUT_S, Agent, Part
from .errors import FuselinkError
from .memory import HostBuffer
from .tls import Tls
from .watch import MAX_PENDING_EVENTS, Watch

__all__ = ["Agent", "Part", "FuselinkError", "HostBuffer", "Tls", "Watch", "DEFAULT_CALL_TIMEOUT_S",
           "MAX_PENDING_EVENTS", "reasons"]
