"""Two agents on one GPU machine, GPU tensors lent by PyTorch engines.

Run by gpu_cluster_test.sh, which starts the testbed and the agents and passes their
addresses. Modes:
  check   the GPU tests: direct and relayed transfers checked on the GPUs, the relay
          cap, memory pressure on a relay GPU, an engine that exits mid-transfer, a
          handle the driver refuses. Exit 1 on the first failure.
  bench   one hot GPU sends --gib GiB to the other node, --rounds times; one JSON line.
  local   in-node moves on node-a (GPU to GPU, host to host) against a plain copy of
          the same bytes (torch copy_: cudaMemcpyAsync / peer copy, memcpy), --rounds
          times each, side by side; one JSON line.
"""
import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import torch

import fuselink

MIB = 1 << 20


def metrics(url):
    """name{labels} -> value, from an agent's /metrics."""
    out = {}
    for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def metric(url, name, **labels):
    """One sample; a missing one fails the check rather than reading as 0."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    key = f"{name}{{{want}}}" if want else name
    values = metrics(url)
    assert key in values, f"{url} has no {key}"
    return values[key]


def kv_cache(gpu, gib, fill):
    """A KV cache of 4 MiB blocks, 8 layers, on `gpu`: random bytes or zeros."""
    blocks = int(gib * 1024) // 4 // 8
    t = torch.empty(8 * blocks * 4 * MIB, dtype=torch.uint8, device=f"cuda:{gpu}")
    if fill:
        t.random_(0, 256)
    else:
        t.zero_()
    torch.cuda.synchronize(gpu)
    return t, dict(layers=8, blocks_per_layer=blocks)


class VmmTensor:
    """A CUDA VMM allocation exportable as a POSIX fd (what a VMM-based allocator
    holds), mapped here and seen by torch as a uint8 tensor."""

    class _Location(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

    class _Flags(ctypes.Structure):
        _fields_ = [("compression", ctypes.c_ubyte), ("rdma", ctypes.c_ubyte),
                    ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]

    class _Prop(ctypes.Structure):
        pass

    class _Access(ctypes.Structure):
        pass

    _Prop._fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int),
                      ("location", _Location), ("win32", ctypes.c_void_p),
                      ("flags", _Flags)]
    _Access._fields_ = [("location", _Location), ("flags", ctypes.c_int)]

    def __init__(self, gpu, size):
        cuda = ctypes.CDLL("libcuda.so.1")
        torch.cuda.set_device(gpu)
        torch.cuda.synchronize(gpu)  # the primary context is current on this thread

        def check(result, call):
            if result != 0:
                raise RuntimeError(f"{call}: CUresult {result}")
        device = self._Location(1, gpu)  # CU_MEM_LOCATION_TYPE_DEVICE
        prop = self._Prop(1, 1, device, None, self._Flags())  # pinned, POSIX fd
        self.handle = ctypes.c_ulonglong()
        check(cuda.cuMemCreate(ctypes.byref(self.handle), ctypes.c_size_t(size),
                               ctypes.byref(prop), ctypes.c_ulonglong(0)), "cuMemCreate")
        fd = ctypes.c_int(-1)
        check(cuda.cuMemExportToShareableHandle(ctypes.byref(fd), self.handle, 1,
                                                ctypes.c_ulonglong(0)),
              "cuMemExportToShareableHandle")
        self.fd = fd.value
        self.ptr = ctypes.c_ulonglong()
        check(cuda.cuMemAddressReserve(ctypes.byref(self.ptr), ctypes.c_size_t(size),
                                       ctypes.c_size_t(0), ctypes.c_ulonglong(0),
                                       ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        check(cuda.cuMemMap(self.ptr, ctypes.c_size_t(size), ctypes.c_size_t(0),
                            self.handle, ctypes.c_ulonglong(0)), "cuMemMap")
        access = self._Access(device, 3)  # read-write
        check(cuda.cuMemSetAccess(self.ptr, ctypes.c_size_t(size), ctypes.byref(access),
                                  ctypes.c_size_t(1)), "cuMemSetAccess")
        self.size = size
        self._cuda = cuda
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1",
                                         "data": (self.ptr.value, False), "version": 3}
        self.tensor = torch.as_tensor(self, device=f"cuda:{gpu}")

    def release(self):
        """Lets go of this process's mapping, handle and fd: the memory stays only as
        long as someone else (the agent) maps it."""
        self.tensor = None
        torch.cuda.synchronize()
        self._cuda.cuMemUnmap(self.ptr, ctypes.c_size_t(self.size))
        self._cuda.cuMemAddressFree(self.ptr, ctypes.c_size_t(self.size))
        self._cuda.cuMemRelease(self.handle)
        os.close(self.fd)


def same_on_gpu(a, b):
    """Compares two tensors on the GPU: a checksum each (sum of 64-bit words, weighted
    by position) and then every byte."""
    b = b.to(a.device)
    wa = a.view(torch.int64)
    wb = b.view(torch.int64)
    weights = torch.arange(1, wa.numel() + 1, device=a.device, dtype=torch.int64)
    return bool((wa * weights).sum() == (wb * weights).sum()) and bool(torch.equal(a, b))


def connect(args, address, kind, handle_socket=None):
    """An Agent at `address` speaking as `kind` (engine e1 or router r1 of --tls_dir,
    the default policy's engine and router), or without TLS under --plaintext."""
    if args.plaintext:
        return fuselink.Agent(address, handle_socket=handle_socket, plaintext=True)
    name = {"engine": "e1", "router": "r1"}[kind]
    return fuselink.Agent(address, handle_socket=handle_socket,
                          tls=fuselink.Tls.from_dir(args.tls_dir, kind, name))


class Cluster:
    """The engines on node-a (a) and node-b (b), and a router that asks node-a."""

    def __init__(self, args):
        self.a = connect(args, args.a, "engine", args.a_socket)
        self.b = connect(args, args.b, "engine", args.b_socket)
        self.router = connect(args, args.a, "router")
        self.a_metrics = args.a_metrics
        self.b_metrics = args.b_metrics
        self.gpus = torch.cuda.device_count()
        self.n = 0

    def move(self, source_gpu, target_gpu, gib, **kw):
        """Registers a random cache on node-a and a zeroed one on node-b, moves it,
        checks it on the GPU. Returns (completed event, seconds)."""
        self.n += 1
        name = f"kv{self.n}"
        src, shape = kv_cache(source_gpu, gib, True)
        dst, _ = kv_cache(target_gpu, gib, False)
        self.a.register_kv_cache(name, src, **shape)
        self.b.register_kv_cache(name, dst, **shape)
        start = time.monotonic()
        done = self.router.transfer(name, self.b.node, name, **kw)
        seconds = time.monotonic() - start
        self.b.wait_for_transfer(name, timeout=60)
        ok = same_on_gpu(src, dst)
        self.a.unregister(name)
        self.b.unregister(name)
        if not ok:
            raise AssertionError(f"{name}: GPU {source_gpu} -> GPU {target_gpu}: bytes differ")
        return done, seconds


def cache(where, gib, fill):
    """A cache of kv_cache's shape on GPU `where`, or in host memory ("host": a
    HostBuffer, with a torch view of it). Returns (what to register, torch view)."""
    if where != "host":
        t, _ = kv_cache(where, gib, fill)
        return t, t
    buf = fuselink.HostBuffer(int(gib * 1024) // 4 // 8 * 8 * 4 * MIB)
    view = torch.frombuffer(buf.data, dtype=torch.uint8)
    if fill:
        view.random_(0, 256)
    return buf, view


class InNode:
    """A random cache at `source` and a zeroed one at `target` (GPU index or "host"),
    both registered on node-a; move() moves one into the other and checks the bytes."""

    def __init__(self, c, source, target, gib):
        c.n += 1
        self.c, self.source, self.target = c, source, target
        self.names = (f"local-src{c.n}", f"local-dst{c.n}")
        self.src, self.src_view = cache(source, gib, True)
        self.dst, self.dst_view = cache(target, gib, False)
        blocks = int(gib * 1024) // 4 // 8
        for name, t in zip(self.names, (self.src, self.dst)):
            c.a.register_kv_cache(name, t, layers=8, blocks_per_layer=blocks)

    def move(self):
        """Returns (completed event, seconds of the TransferKVCache call)."""
        self.dst_view.zero_()
        start = time.monotonic()
        done = self.c.router.transfer(self.names[0], self.c.a.node, self.names[1])
        seconds = time.monotonic() - start
        self.c.a.wait_for_transfer(self.names[1], timeout=60)
        if not same_on_gpu(self.src_view.cuda(), self.dst_view.cuda()):
            raise AssertionError(f"in-node {self.source} -> {self.target}: bytes differ")
        return done, seconds

    def close(self):
        for name in self.names:
            self.c.a.unregister(name)
        del self.src_view, self.dst_view  # a HostBuffer closes once no view holds it
        for t in (self.src, self.dst):
            if isinstance(t, fuselink.HostBuffer):
                t.close()


def per_nic(event):
    return {n.nic: n.bytes for n in event.completed.per_nic}


def check(c, args):
    g = c.gpus
    results = []

    def ok(what):
        print(f"PASS {what}", flush=True)
        results.append(what)

    # Direct, and into another GPU on the far side (lands on the NIC's GPU, crosses NVLink).
    done, _ = c.move(0, 0, 1)
    ok(f"GPU 0 -> GPU 0, 1 GiB, bytes match on the GPU; per NIC {per_nic(done)}")

    # In-node moves: source and target on node-a, by its copy engines, no NIC.
    pairs = [(0, 0), ("host", 0), (0, "host"), ("host", "host")]
    if g >= 2:
        pairs.insert(1, (0, 1))
    for source, target in pairs:
        gpu_before = metric(c.a_metrics, "fuselink_in_node_bytes_total", copy="gpu")
        pair = InNode(c, source, target, 0.25)
        done, _ = pair.move()
        pair.close()
        total = done.completed.total_bytes
        assert per_nic(done) == {"local": total}, f"in-node split {per_nic(done)}"
        grew = metric(c.a_metrics, "fuselink_in_node_bytes_total", copy="gpu") - gpu_before
        want = 0 if source == target == "host" else total
        assert grew == want, f"in_node_bytes_total{{copy=gpu}} grew {grew}, not {want}"
        ok(f"in-node {source} -> {target}, 256 MiB, bytes match; per NIC {per_nic(done)}")
    if g < 2:
        print(f"SKIP relay checks: they need 2 GPUs, this machine has {g}", flush=True)
    else:
        staged_before = metric(c.a_metrics, "fuselink_relay_staged_bytes_total",
                               stage=args.stage)
        peak = [0.0]
        stop = threading.Event()

        def watch_cap():
            while not stop.is_set():
                for gpu in range(g):
                    peak[0] = max(peak[0], metric(c.a_metrics, "fuselink_relay_device_bytes",
                                                  gpu=gpu))
                time.sleep(0.02)
        t = threading.Thread(target=watch_cap)
        t.start()
        done, _ = c.move(0, 1, 2)
        stop.set()
        t.join()
        nics = per_nic(done)
        borrowed = sum(v for k, v in nics.items() if k != "rail0")
        staged = metric(c.a_metrics, "fuselink_relay_staged_bytes_total",
                        stage=args.stage) - staged_before
        cap = metric(c.a_metrics, "fuselink_relay_device_cap_bytes")
        assert borrowed > 0, f"nothing went through a borrowed NIC: {nics}"
        assert staged >= borrowed, f"relay staged {staged} < borrowed {borrowed}"
        assert 0 < peak[0] <= cap, f"relay memory peaked at {peak[0]}, cap {cap}"
        ok(f"GPU 0 -> GPU 1, 2 GiB, relayed ({args.stage}): per NIC {nics}; staged "
           f"{staged / MIB:.0f} MiB; relay memory peak {peak[0] / MIB:.0f} MiB <= cap "
           f"{cap / MIB:.0f} MiB")

        # Memory pressure on GPU 1: a process takes its memory; the pool gives its
        # slots back, borrowing through GPU 1 pauses, the transfer still completes.
        free, _ = torch.cuda.mem_get_info(1)
        hog = subprocess.Popen([sys.executable, "-c",
                                "import torch,sys,time\n"
                                f"x=torch.empty({free} - {args.leave_free_mib} * {MIB},"
                                " dtype=torch.uint8, device='cuda:1')\n"
                                "print('held', flush=True)\ntime.sleep(600)\n"],
                               stdout=subprocess.PIPE, text=True)
        try:
            assert hog.stdout.readline().strip() == "held", "the memory hog failed"
            deadline = time.monotonic() + 10
            while metric(c.a_metrics, "fuselink_relay_paused", gpu=1) != 1:
                assert time.monotonic() < deadline, "GPU 1's relay did not pause"
                time.sleep(0.1)
            held = metric(c.a_metrics, "fuselink_relay_device_bytes", gpu=1)
            assert held == 0, f"GPU 1 still holds {held} relay bytes under pressure"
            before = metric(c.a_metrics, "fuselink_nic_transmitted_bytes_total",
                            nic="rail1", owner_gpu=1, traffic="borrowed")
            done, _ = c.move(0, 0, 1)
            after = metric(c.a_metrics, "fuselink_nic_transmitted_bytes_total",
                           nic="rail1", owner_gpu=1, traffic="borrowed")
            assert after == before, "rail1 carried borrowed bytes while GPU 1 was short"
            ok(f"GPU 1 short of memory: relay paused, 0 bytes held, the transfer "
               f"completed on {per_nic(done)}")
        finally:
            hog.kill()
            hog.wait()
        deadline = time.monotonic() + 10
        while metric(c.a_metrics, "fuselink_relay_paused", gpu=1) != 0:
            assert time.monotonic() < deadline, "GPU 1's relay did not resume"
            time.sleep(0.1)
        ok("GPU 1's memory back: relay resumed")

    # A VMM allocation lent by its POSIX fd, as target.
    from fuselink.memory import send_fd
    from fuselink.v1 import agent_pb2, tensor_pb2
    vmm_gpu = g - 1
    vmm = VmmTensor(vmm_gpu, 256 * MIB)
    vmm.tensor.zero_()
    src, _ = kv_cache(0, 0.25, True)
    shape = dict(layers=8, blocks_per_layer=8)
    c.a.register_kv_cache("vmm-src", src, **shape)
    req = agent_pb2.RegisterTensorRequest(
        name="vmm-dst", layout=tensor_pb2.Layout(layers=8, blocks_per_layer=8,
                                                 block_bytes=4 * MIB))
    req.memory.vmm.CopyFrom(tensor_pb2.VmmMemory(
        fd_token=send_fd(c.b.handle_socket, vmm.fd), size_bytes=vmm.size, gpu=vmm_gpu,
        allocation_bytes=vmm.size))
    registered = c.b._call(c.b._stub.RegisterTensor, req)
    assert registered.memory_kind == "vmm", registered
    with c.b.watch("vmm-dst") as w:
        c.router.transfer("vmm-src", c.b.node, "vmm-dst")
        w.wait(60)
    torch.cuda.synchronize(vmm_gpu)
    assert same_on_gpu(src, vmm.tensor), "bytes differ in the VMM tensor"
    c.a.unregister("vmm-src")
    # The engine lets go of its allocation; the agent's import keeps it alive until
    # the tensor is unregistered there.
    vmm.release()
    before, _ = torch.cuda.mem_get_info(vmm_gpu)
    time.sleep(0.5)
    assert torch.cuda.mem_get_info(vmm_gpu)[0] < before + vmm.size // 2, \
        "the VMM memory was freed while the agent still had it registered"
    c.b.unregister("vmm-dst")
    deadline = time.monotonic() + 5
    while torch.cuda.mem_get_info(vmm_gpu)[0] < before + vmm.size * 9 // 10:
        assert time.monotonic() < deadline, "unregistering did not free the VMM memory"
        time.sleep(0.05)
    ok(f"GPU 0 -> a VMM allocation on GPU {vmm_gpu} lent by its fd: bytes match; the "
       f"memory lived until unregistered, then was freed")

    # An engine that exits mid-transfer: its transfer fails, the agent lets go.
    engine = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "engine", "--a", args.a,
         "--a_socket", args.a_socket, "--gib", "4"] +
        (["--plaintext"] if args.plaintext else ["--tls_dir", args.tls_dir]),
        stdout=subprocess.PIPE, text=True)
    try:
        assert engine.stdout.readline().strip() == "lent", "the engine did not start"
        dst, shape = kv_cache(0, 4, False)
        c.b.register_kv_cache("orphan", dst, **shape)
        failure = {}

        def run():
            try:
                c.router.transfer("orphan", c.b.node, "orphan")
            except fuselink.FuselinkError as e:
                failure["error"] = e
        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.3)
        free_before, _ = torch.cuda.mem_get_info(0)
        engine.send_signal(signal.SIGKILL)
        t.join(60)
        e = failure.get("error")
        assert e is not None, "the transfer did not fail"
        assert e.reason == "OWNER_EXITED", f"failed with {e.code} {e.reason}: {e}"
        try:
            c.a.get_tensor("orphan")
            raise AssertionError("node-a still holds the exited engine's tensor")
        except fuselink.FuselinkError as gone:
            assert gone.code.name == "NOT_FOUND", gone
        c.b.unregister("orphan")
        # Its 4 GiB come back: the agent no longer holds them.
        deadline = time.monotonic() + 5
        while torch.cuda.mem_get_info(0)[0] < free_before + (4 << 30) * 9 // 10:
            assert time.monotonic() < deadline, "the exited engine's memory stays held"
            time.sleep(0.05)
        ok(f"engine killed mid-transfer: {e.code.name} {e.reason}; node-a dropped its "
           f"tensor and its GPU memory came back")
    finally:
        engine.kill()
        engine.wait()

    from fuselink.memory import send_owner_pidfd
    # A handle by gRPC alone (no token from the handle socket), then one the driver
    # cannot open, from a local process that proved itself.
    req = agent_pb2.RegisterTensorRequest(
        name="bogus", layout=tensor_pb2.Layout(layers=1, blocks_per_layer=1,
                                               block_bytes=MIB))
    req.memory.cuda_ipc.CopyFrom(tensor_pb2.CudaIpcMemory(
        handle=bytes(range(64)), size_bytes=MIB, gpu=0))
    for token, code, reason in ((False, "PERMISSION_DENIED", "OWNER_TOKEN_REQUIRED"),
                                (True, "INVALID_ARGUMENT", "BAD_GPU_HANDLE")):
        if token:
            req.owner_fd_token = send_owner_pidfd(c.a.handle_socket)
        try:
            c.a._call(c.a._stub.RegisterTensor, req)
            raise AssertionError("a bogus CUDA IPC handle was accepted")
        except fuselink.FuselinkError as e:
            assert e.code.name == code and e.reason == reason, e
            ok(f"bogus IPC handle: {e.code.name} {e.reason}: {e}")
    c.a.topology()
    print(f"all {len(results)} GPU checks passed", flush=True)


def engine(args):
    """A PyTorch engine that lends a cache to node-a and waits to be killed."""
    agent = connect(args, args.a, "engine", args.a_socket)
    src, shape = kv_cache(0, args.gib, True)
    agent.register_kv_cache("orphan", src, **shape)
    print("lent", flush=True)
    time.sleep(600)


def bench(c, args):
    rates = []
    for _ in range(args.rounds):
        done, seconds = c.move(0, 0, args.gib)
        rates.append(done.completed.total_bytes / seconds / 1e9)
    print(json.dumps({"label": args.label, "gib": args.gib, "rounds": args.rounds,
                      "gbytes_per_s": rates, "median": sorted(rates)[len(rates) // 2],
                      "per_nic_last": per_nic(done)}), flush=True)


def local_bench(c, args):
    """In-node moves against a plain copy of the same bytes (GPU: torch copy_, a
    cudaMemcpyAsync or peer copy; host: one libc memcpy), rounds interleaved, each
    side between the same two tensors every round (so first-touch faults of new
    memory fall in round 1 of both)."""
    pairs = [(0, 1 if c.gpus >= 2 else 0), ("host", "host")]
    out = {"gib": args.gib, "rounds": args.rounds, "gpus": c.gpus}
    med = lambda v: sorted(v)[len(v) // 2]
    for source, target in pairs:
        moved, agent, plain = [], [], []
        pair = InNode(c, source, target, args.gib)
        _, src_view = cache(source, args.gib, True)
        dst, dst_view = cache(target, args.gib, False)
        for _ in range(args.rounds):
            done, seconds = pair.move()
            moved.append(done.completed.total_bytes / seconds / 1e9)
            agent.append(done.completed.total_bytes / done.completed.seconds / 1e9)
            if source == "host":
                start = time.monotonic()
                ctypes.memmove(dst_view.data_ptr(), src_view.data_ptr(), dst_view.numel())
            else:
                torch.cuda.synchronize(source)
                start = time.monotonic()
                dst_view.copy_(src_view)
                torch.cuda.synchronize(source)
                torch.cuda.synchronize(target)
            plain.append(dst_view.numel() / (time.monotonic() - start) / 1e9)
        # The call's rate (the client's gRPC call, prepare, verdict) and the agent's
        # (from acceptance to the target's verdict: completed.seconds).
        out[f"{source}->{target}"] = {"call_gbytes_per_s": moved,
                                     "agent_gbytes_per_s": agent,
                                     "plain_copy_gbytes_per_s": plain,
                                     "call_ratio_of_medians": med(moved) / med(plain),
                                     "agent_ratio_of_medians": med(agent) / med(plain)}
        pair.close()
    print(json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["check", "bench", "local", "engine"])
    for n in ("a", "b"):
        p.add_argument(f"--{n}")
        p.add_argument(f"--{n}_socket")
        p.add_argument(f"--{n}_metrics")
    p.add_argument("--stage", default="d2")
    p.add_argument("--gib", type=float, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--label", default="")
    p.add_argument("--leave_free_mib", type=int, default=1024)
    p.add_argument("--tls_dir", help="scripts/certs.sh's folder (engine-e1, router-r1)")
    p.add_argument("--plaintext", action="store_true")
    args = p.parse_args()
    if bool(args.tls_dir) == args.plaintext:
        p.error("give --tls_dir or --plaintext")
    if args.mode == "engine":
        return engine(args)
    c = Cluster(args)
    {"check": check, "bench": bench, "local": local_bench}[args.mode](c, args)


if __name__ == "__main__":
    main()
