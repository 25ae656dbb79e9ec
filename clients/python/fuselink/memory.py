"""Memory an engine lends its agent, and the handle socket that carries descriptors.

Host memory lives in a memfd (HostBuffer) whose descriptor goes to the agent over
its Unix handle socket (services/handle_socket/socket.h); GPU memory is a PyTorch CUDA
tensor exported by a CUDA IPC handle of the allocation that holds it. gRPC cannot
carry descriptors, so the socket answers each one with a token that RegisterTensor
then names.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import socket
import struct

from .errors import FuselinkError, code_from_int

# The handle socket's answer: u32 code (0 is OK), u32 reserved, u64 token.
_REPLY = struct.Struct("<IIQ")
_SOCKET_TIMEOUT_S = 10
_IPC_HANDLE_BYTES = 64  # sizeof(CUipcMemHandle)


def send_fd(socket_path: str, fd: int) -> int:
    """Passes `fd` to the agent listening at `socket_path`; returns its token.

    The token is valid once, for 60 s: register the tensor right away. The agent holds
    its own copy of the descriptor; the caller may close `fd` afterwards. Raises
    OSError when the socket cannot be reached, FuselinkError when the agent refuses.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(_SOCKET_TIMEOUT_S)
        s.connect(socket_path)
        socket.send_fds(s, [b"F"], [fd])
        reply = b""
        while len(reply) < _REPLY.size:
            part = s.recv(_REPLY.size - len(reply))
            if not part:
                raise ConnectionError(f"handle socket {socket_path} closed without answering")
            reply += part
    code, _, token = _REPLY.unpack(reply)
    if code != 0:
        raise FuselinkError(code_from_int(code),
                            f"handle socket {socket_path} refused the descriptor")
    return token


def send_owner_pidfd(socket_path: str) -> int:
    """Sends a pidfd of this process; the agent drops our tensors when we exit."""
    fd = os.pidfd_open(os.getpid())
    try:
        return send_fd(socket_path, fd)
    finally:
        os.close(fd)


class HostBuffer:
    """`size_bytes` of shared host memory: a memfd, mapped read-write in this process.

    `data` is the mapping (a mmap object: slice it to read and write, or wrap it with
    memoryview, numpy.frombuffer or torch.frombuffer). The agent maps the same pages,
    so bytes a transfer lands are visible here at once. Closing the buffer unmaps it
    here only; the agent keeps its mapping until the tensor is unregistered.
    """

    def __init__(self, size_bytes: int, name: str = "fuselink") -> None:
        if size_bytes <= 0:
            raise ValueError(f"size_bytes must be positive, not {size_bytes}")
        self.size_bytes = size_bytes
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size_bytes)
            self.data = mmap.mmap(self.fd, size_bytes)  # MAP_SHARED, read-write
            # Huge pages where the node allows them for shared memory (advice before
            # the first touch; ignored where shmem_enabled is never, and refused by a
            # kernel built without them, which is no error here).
            try:
                self.data.madvise(mmap.MADV_HUGEPAGE)
            except (AttributeError, OSError):
                pass
        except BaseException:
            os.close(self.fd)
            raise

    def __len__(self) -> int:
        return self.size_bytes

    def close(self) -> None:
        """Unmaps and closes. Fails (BufferError) while a memoryview of `data` lives."""
        if self.fd < 0:
            return
        self.data.close()
        os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> "HostBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Driver:
    """The two CUDA driver calls an IPC export needs, through ctypes (libcuda.so.1)."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        u64 = ctypes.c_uint64  # CUdeviceptr
        lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuMemGetAddressRange_v2.argtypes = [
            ctypes.POINTER(u64), ctypes.POINTER(ctypes.c_size_t), u64]
        lib.cuIpcGetMemHandle.argtypes = [ctypes.c_void_p, u64]
        self._lib = lib

    def _check(self, result, call):
        if result == 0:
            return
        text = ctypes.c_char_p()
        self._lib.cuGetErrorString(result, ctypes.byref(text))
        name = text.value.decode() if text.value else "unknown error"
        raise RuntimeError(f"{call}: CUDA error {result} ({name})")

    def allocation_base(self, address):
        """The first address of the allocation that holds `address`."""
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._check(self._lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                                      address),
                    "cuMemGetAddressRange")
        return base.value

    def ipc_handle(self, base):
        """The 64-byte IPC handle of the allocation starting at `base`."""
        handle = ctypes.create_string_buffer(_IPC_HANDLE_BYTES)
        self._check(self._lib.cuIpcGetMemHandle(handle, base), "cuIpcGetMemHandle")
        return handle.raw


_driver = None  # loaded on first use: hosts without a GPU never touch libcuda


def is_cuda_tensor(obj: object) -> bool:
    """True for a PyTorch CUDA tensor; needs no torch import to decide."""
    return bool(getattr(obj, "is_cuda", False)) and hasattr(obj, "data_ptr")


def cuda_ipc_export(tensor):
    """(handle, offset_bytes, size_bytes, gpu) of a contiguous PyTorch CUDA tensor.

    The handle names the whole allocation the tensor lives in (PyTorch's caching
    allocator hands out pieces of larger cudaMalloc blocks), so the tensor is found at
    offset_bytes inside it. Allocations made with expandable segments
    (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) have no IPC handle: the driver
    refuses, and this raises RuntimeError.
    """
    import torch  # only GPU tensors need torch

    global _driver
    if not tensor.is_contiguous():
        raise ValueError("a CUDA tensor must be contiguous to be lent to the agent")
    if _driver is None:
        _driver = _Driver()
    address = tensor.data_ptr()
    with torch.cuda.device(tensor.device):
        # Driver calls act on the current context; a runtime call on the device makes
        # its primary context (the one PyTorch uses) current on this thread.
        torch.cuda.synchronize()
        base = _driver.allocation_base(address)
        handle = _driver.ipc_handle(base)
    return handle, address - base, tensor.numel() * tensor.element_size(), tensor.device.index
