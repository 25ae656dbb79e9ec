"""The Python client against two real agents (started by client_test.sh).

Host memory on both nodes: node-a's agent moves blocks of a HostBuffer into one on
node-b, the client waits for them through WatchTransfers, and the bytes are compared
in node-b's buffer, block by block. Then the errors: each bad input surfaces as a
FuselinkError with its gRPC code and the agent's reason.

Mutual TLS under the default policy, as a deployment runs it: an engine's certificate
(engine-e1) lends the buffers on both nodes and waits for them, a router's (router-r1)
moves them; what each may not do is refused with its reason.

Environment: FL_SOURCE_AGENT, FL_SOURCE_SOCKET (node-a), FL_TARGET_AGENT,
FL_TARGET_SOCKET, FL_TARGET_NODE (node-b), FL_PKI (scripts/certs.sh's folder), and
FL_INSTALLED_IN where the package must come from an installed wheel (its venv).
"""

import ctypes
import os
import threading
import time
import unittest
from unittest import mock

import grpc

import fuselink
from fuselink.memory import send_fd
from fuselink.v1 import agent_pb2, tensor_pb2

LAYERS = 4
BLOCKS = 16
BLOCK_BYTES = 64 << 10
SIZE_BYTES = LAYERS * BLOCKS * BLOCK_BYTES
WAIT_S = 30


def block(buffer, layer, index):
    """Bytes of block `index` of `layer` in a packed layout."""
    begin = (layer * BLOCKS + index) * BLOCK_BYTES
    return buffer.data[begin:begin + BLOCK_BYTES]


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        pki = os.environ["FL_PKI"]
        cls.engine_tls = fuselink.Tls.from_dir(pki, "engine", "e1")
        cls.router_tls = fuselink.Tls.from_dir(pki, "router", "r1")
        # The engines on node-a and node-b, and the router, which asks node-a.
        cls.source = fuselink.Agent(os.environ["FL_SOURCE_AGENT"],
                                    handle_socket=os.environ["FL_SOURCE_SOCKET"],
                                    tls=cls.engine_tls)
        cls.target = fuselink.Agent(os.environ["FL_TARGET_AGENT"],
                                    handle_socket=os.environ["FL_TARGET_SOCKET"],
                                    tls=cls.engine_tls)
        cls.router = fuselink.Agent(os.environ["FL_SOURCE_AGENT"],
                                    handle_socket=os.environ["FL_SOURCE_SOCKET"],
                                    tls=cls.router_tls)
        cls.target_node = os.environ["FL_TARGET_NODE"]

    @classmethod
    def tearDownClass(cls):
        cls.source.close()
        cls.target.close()
        cls.router.close()

    def lend(self, agent, name, fill, **kwargs):
        """A HostBuffer of random bytes (or zeros) registered as `name` on `agent`."""
        buffer = fuselink.HostBuffer(SIZE_BYTES, name)
        if fill:
            buffer.data[:] = os.urandom(SIZE_BYTES)
        self.addCleanup(buffer.close)
        tensor = agent.register_kv_cache(name, buffer, LAYERS, BLOCKS, **kwargs)
        self.addCleanup(agent.unregister, name)
        self.assertEqual(tensor.memory_kind, "host")
        self.assertEqual(tensor.layout.block_bytes, BLOCK_BYTES)
        return buffer

    def until_started(self, call, *args):
        """call(*args) once the transfer it names exists at the source (a transfer
        started on another thread); its answer."""
        for _ in range(200):
            try:
                return call(*args)
            except fuselink.FuselinkError as e:
                self.assertEqual(e.reason, "UNKNOWN_TRANSFER")
                time.sleep(0.01)
        self.fail("the transfer never started")

    def assertError(self, code, reason, fn, *args, **kwargs):
        with self.assertRaises(fuselink.FuselinkError) as caught:
            fn(*args, **kwargs)
        self.assertEqual((caught.exception.code, caught.exception.reason), (code, reason),
                         str(caught.exception))

    def test_the_package_is_the_installed_one(self):
        venv = os.environ.get("FL_INSTALLED_IN")  # client_test.sh sets it for a venv
        if not venv:
            self.skipTest("run from the build tree (FL_INSTALLED_IN unset)")
        for module in (fuselink, agent_pb2):
            where = os.path.realpath(module.__file__)
            self.assertTrue(where.startswith(os.path.realpath(venv) + os.sep), where)

    def test_transfer_lands_and_is_seen(self):
        src = self.lend(self.source, "py-lands-src", fill=True)
        dst = self.lend(self.target, "py-lands-dst", fill=False)
        self.assertEqual(self.router.node, "node-a")
        # Every block into its mirror image, layers 1 to 3 only; layer 0 stays zero.
        target_blocks = list(reversed(range(BLOCKS)))
        events = []
        final = self.router.transfer("py-lands-src", self.target_node, "py-lands-dst",
                                     target_blocks=target_blocks, layers=(1, LAYERS),
                                     on_event=events.append, timeout=WAIT_S)
        moved = (LAYERS - 1) * BLOCKS * BLOCK_BYTES
        self.assertTrue(events[0].HasField("accepted"))
        self.assertEqual(final.completed.total_bytes, moved)
        self.assertEqual(sum(n.bytes for n in final.completed.per_nic), moved)

        # The watch began at registration, before the transfer: nothing is missed.
        landed = self.target.wait_for_transfer("py-lands-dst", timeout=WAIT_S)
        self.assertEqual(landed.code, 0)
        self.assertEqual(landed.transfer_id, final.transfer_id)
        self.assertEqual(landed.source_node, "node-a")
        self.assertEqual(landed.bytes, moved)
        self.assertEqual(list(landed.block_ids), target_blocks)
        self.assertEqual((landed.layers.begin, landed.layers.end), (1, LAYERS))

        zeros = bytes(BLOCK_BYTES)
        for layer in range(LAYERS):
            for b in range(BLOCKS):
                want = zeros if layer == 0 else block(src, layer, b)
                self.assertEqual(block(dst, layer, target_blocks[b]), want,
                                 f"layer {layer}, source block {b}")

    def test_in_node_move(self):
        """Source and target on node-a: its copy engines move it, on one lane."""
        src = self.lend(self.source, "py-local-src", fill=True)
        dst = self.lend(self.source, "py-local-dst", fill=False)
        final = self.router.transfer("py-local-src", self.router.node, "py-local-dst",
                                     blocks=[0, 5], target_blocks=[7, 2], timeout=WAIT_S)
        self.assertEqual({n.nic: n.bytes for n in final.completed.per_nic},
                         {"local": 2 * LAYERS * BLOCK_BYTES})
        landed = self.source.wait_for_transfer("py-local-dst", timeout=WAIT_S)
        self.assertEqual((landed.code, landed.source_node), (0, "node-a"))
        for layer in range(LAYERS):
            self.assertEqual(block(dst, layer, 7), block(src, layer, 0))
            self.assertEqual(block(dst, layer, 2), block(src, layer, 5))
        self.assertError(grpc.StatusCode.INVALID_ARGUMENT, "SAME_BLOCKS",
                         self.router.transfer, "py-local-src", self.router.node,
                         "py-local-src", blocks=[1], timeout=WAIT_S)
        self.assertRaises(ValueError, self.router.transfer, "kv", self.router.node, "kv",
                          source_node=self.target_node)

    def test_a_lease_nobody_renews_ends_the_transfer(self):
        self.lend(self.source, "py-lease-src", fill=True)
        self.lend(self.target, "py-lease-dst", fill=False)
        self.assertError(grpc.StatusCode.DEADLINE_EXCEEDED, "LEASE_EXPIRED",
                         self.router.transfer, "py-lease-src", self.target_node,
                         "py-lease-dst", request_id="py-lease", layer_by_layer=True,
                         lease_ms=200, timeout=WAIT_S)
        self.assertError(grpc.StatusCode.FAILED_PRECONDITION, "TRANSFER_FINISHED",
                         self.router.extend_lease, "py-lease")
        # The target lets its slot go on the source's abort notice, and says so.
        with self.assertRaises(fuselink.FuselinkError):
            self.target.wait_for_transfer("py-lease-dst", timeout=WAIT_S)

    def test_explicit_watch(self):
        src = self.lend(self.source, "py-watch-src", fill=True)
        dst = self.lend(self.target, "py-watch-dst", fill=False, watch=False)
        with self.target.watch("py-watch-dst") as watch:
            self.router.transfer("py-watch-src", self.target_node, "py-watch-dst",
                                 blocks=[3, 4], target_blocks=[7, 9], timeout=WAIT_S)
            landed = watch.wait(WAIT_S)
        self.assertEqual(landed.bytes, 2 * LAYERS * BLOCK_BYTES)
        for layer in range(LAYERS):
            self.assertEqual(block(dst, layer, 7), block(src, layer, 3))
            self.assertEqual(block(dst, layer, 9), block(src, layer, 4))
        # Nothing else lands: waiting again times out.
        with self.assertRaises(TimeoutError):
            self.target.wait_for_transfer("py-watch-dst", timeout=0.2)

    def test_errors_carry_code_and_reason(self):
        self.lend(self.source, "py-err-src", fill=True)
        self.lend(self.target, "py-err-dst", fill=False)
        node = self.target_node
        self.assertError(grpc.StatusCode.NOT_FOUND, "UNKNOWN_TENSOR", self.router.transfer,
                         "py-no-such-tensor", node, "py-err-dst", blocks=[0])
        self.assertError(grpc.StatusCode.OUT_OF_RANGE, "BLOCK_OUT_OF_RANGE",
                         self.router.transfer, "py-err-src", node, "py-err-dst",
                         blocks=[BLOCKS])
        # Refused by node-b's agent and passed back by node-a's.
        self.assertError(grpc.StatusCode.NOT_FOUND, "UNKNOWN_TENSOR", self.router.transfer,
                         "py-err-src", node, "py-no-such-tensor", blocks=[0])
        self.assertError(grpc.StatusCode.NOT_FOUND, "UNKNOWN_NODE", self.router.transfer,
                         "py-err-src", "node-z", "py-err-dst", blocks=[0])
        self.assertError(grpc.StatusCode.OUT_OF_RANGE, "LAYER_OUT_OF_RANGE",
                         self.router.transfer, "py-err-src", node, "py-err-dst",
                         blocks=[0], layers=(2, 2))
        with fuselink.HostBuffer(SIZE_BYTES) as again:
            self.assertError(grpc.StatusCode.ALREADY_EXISTS, "TENSOR_EXISTS",
                             self.source.register_kv_cache, "py-err-src", again, LAYERS,
                             BLOCKS, watch=False)
        self.assertError(grpc.StatusCode.NOT_FOUND, "UNKNOWN_TENSOR", self.target.unregister,
                         "py-no-such-tensor")
        # Checked here, before anything reaches the agent.
        with fuselink.HostBuffer(SIZE_BYTES + 1) as odd, self.assertRaises(ValueError):
            self.source.register_kv_cache("py-odd", odd, LAYERS, BLOCKS)
        with self.assertRaises(TypeError):
            self.source.register_kv_cache("py-bytes", bytearray(SIZE_BYTES), LAYERS, BLOCKS)

    def test_cuda_memory_is_lent_only_with_the_handle_sockets_token(self):
        # A stand-in for a PyTorch CUDA tensor, its export faked: no GPU needed.
        class FakeCudaTensor:
            is_cuda = True

            def data_ptr(self):
                return 0

        export = (b"\x5a" * 64, 0, SIZE_BYTES, 0)
        # Patched where both clients' requests are made (fuselink/_requests.py).
        with mock.patch.object(fuselink._requests, "cuda_ipc_export", return_value=export):
            # The client passes this process's pidfd over the handle socket: the agent
            # takes the handle that far, then finds it cannot open it here (no GPU, or
            # the handle is no real one), never OWNER_TOKEN_REQUIRED.
            with self.assertRaises(fuselink.FuselinkError) as caught:
                self.source.register_kv_cache("py-cuda", FakeCudaTensor(), LAYERS, BLOCKS,
                                              watch=False)
            self.assertIn(caught.exception.reason,
                          {"NO_GPU", "BAD_HOME_GPU", "BAD_GPU_HANDLE"},
                          str(caught.exception))
            # Without the pidfd the client refuses before the agent would.
            with self.assertRaises(ValueError):
                self.source.register_kv_cache("py-cuda", FakeCudaTensor(), LAYERS, BLOCKS,
                                              owner_pidfd=False, watch=False)
        # The agent itself refuses a handle that comes by gRPC alone.
        request = agent_pb2.RegisterTensorRequest(
            name="py-cuda", layout=tensor_pb2.Layout(layers=LAYERS, blocks_per_layer=BLOCKS,
                                                     block_bytes=BLOCK_BYTES))
        request.memory.cuda_ipc.CopyFrom(tensor_pb2.CudaIpcMemory(
            handle=export[0], size_bytes=SIZE_BYTES, gpu=0))
        self.assertError(grpc.StatusCode.PERMISSION_DENIED, "OWNER_TOKEN_REQUIRED",
                         self.source._call, self.source._stub.RegisterTensor, request)

    def test_per_layer_kv_caches_move_between_engine_layouts(self):
        """vLLM's layout on node-a (a buffer per layer, K half then V half) into SGLang's
        on node-b (a K and a V buffer per layer, with room before the blocks), blocks
        to other ids: every part lands where its block's part is, nothing else moves."""
        part = BLOCK_BYTES // 2
        pad = 4096

        def buffers(count, size, fill):
            out = []
            for _ in range(count):
                b = fuselink.HostBuffer(size)
                self.addCleanup(b.close)
                if fill:
                    b.data[:] = os.urandom(size)
                out.append(b)
            return out

        vllm = buffers(LAYERS, 2 * BLOCKS * part, True)
        sglang = buffers(2 * LAYERS, pad + BLOCKS * part, True)
        before = [bytes(b.data) for b in sglang]
        src = self.source.register_kv_layers("py-vllm", vllm, BLOCKS)
        self.addCleanup(self.source.unregister, "py-vllm")
        self.assertEqual(src.layout.parts_per_block, 2)
        self.assertEqual(src.layout.block_bytes, BLOCK_BYTES)
        self.assertEqual(list(src.region_bytes), [2 * BLOCKS * part] * LAYERS)
        # SGLang's buffers here hold their blocks after `pad` bytes: said part by part.
        pairs = [(sglang[2 * l], sglang[2 * l + 1]) for l in range(LAYERS)]
        parts = [[fuselink.Part(2 * l, pad, part), fuselink.Part(2 * l + 1, pad, part)]
                 for l in range(LAYERS)]
        dst = self.target.register_kv_parts("py-sglang", sglang, BLOCKS, parts)
        self.addCleanup(self.target.unregister, "py-sglang")
        self.assertEqual(dst.layout.block_bytes, BLOCK_BYTES)

        blocks, target_blocks = [0, 1, 2, 9], [15, 3, 4, 5]
        final = self.router.transfer("py-vllm", self.target_node, "py-sglang",
                                     blocks=blocks, target_blocks=target_blocks,
                                     layers=(1, LAYERS), timeout=WAIT_S)
        self.assertEqual(final.completed.total_bytes,
                         (LAYERS - 1) * len(blocks) * BLOCK_BYTES)
        landed = self.target.wait_for_transfer("py-sglang", timeout=WAIT_S)
        self.assertEqual(landed.code, 0)
        for layer in range(LAYERS):
            for kv in range(2):
                got = bytes(pairs[layer][kv].data)
                want = bytearray(before[2 * layer + kv])
                if layer >= 1:
                    for s, t in zip(blocks, target_blocks):
                        at = (kv * BLOCKS + s) * part
                        want[pad + t * part:pad + (t + 1) * part] = vllm[layer].data[at:at + part]
                self.assertEqual(got, bytes(want), f"layer {layer}, {'KV'[kv]}")
        # The same blocks back into vLLM's layout on node-a needs no adapting either.
        back = buffers(LAYERS, 2 * BLOCKS * part, False)
        self.source.register_kv_layers("py-vllm-back", back, BLOCKS, watch=False)
        self.addCleanup(self.source.unregister, "py-vllm-back")
        sglang_pairs = self.target.register_kv_layers(
            "py-sglang-pairs", pairs, BLOCKS, part_bytes=part, watch=False)
        self.assertEqual(sglang_pairs.layout.parts[1].region, 1)
        self.target.unregister("py-sglang-pairs")

    def test_the_source_engine_hears_its_blocks_left_or_did_not(self):
        self.lend(self.source, "py-out-src", fill=True, watch=False)
        self.lend(self.target, "py-out-dst", fill=False)
        closed = ["spiffe://fuselink/router/other"]  # this router may not write it
        self.lend(self.target, "py-out-closed", fill=False, readers=closed, writers=closed)
        with self.source.watch("py-out-src", outgoing=True) as out:
            done = self.router.transfer("py-out-src", self.target_node, "py-out-dst",
                                        blocks=[1, 2], timeout=WAIT_S)
            left = out.wait(WAIT_S)
            self.assertTrue(left.outgoing)
            self.assertEqual(left.transfer_id, done.transfer_id)
            self.assertEqual((left.tensor, left.target_node), ("py-out-src", self.target_node))
            self.assertEqual(list(left.block_ids), [1, 2])
            self.assertEqual(list(left.layers_done), list(range(LAYERS)))
            self.assertEqual(list(left.failed_block_ids), [])
            self.assertEqual(left.bytes, 2 * LAYERS * BLOCK_BYTES)
            # Refused by the target: nothing left, every block is the source's still.
            with self.assertRaises(fuselink.FuselinkError):
                self.router.transfer("py-out-src", self.target_node, "py-out-closed",
                                     blocks=[3, 0], timeout=WAIT_S)
            with self.assertRaises(fuselink.FuselinkError) as caught:
                out.wait(WAIT_S)
            failed = caught.exception.event
            self.assertEqual(failed.code, grpc.StatusCode.PERMISSION_DENIED.value[0])
            self.assertEqual(list(failed.failed_block_ids), [3, 0])
            self.assertEqual(list(failed.layers_done), [])
        # An incoming watch on the same node hears none of it.
        with self.assertRaises(TimeoutError):
            self.target.wait_for_transfer("py-out-closed", timeout=0.2)
        # An engine watches the outgoing transfers of its own tensors only.
        self.assertError(grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED", self.source.watch,
                         "", outgoing=True)

    def test_layer_by_layer(self):
        src = self.lend(self.source, "py-lbl-src", fill=True)
        dst = self.lend(self.target, "py-lbl-dst", fill=False)
        events, outcome = [], {}

        def run():
            try:
                outcome["done"] = self.router.transfer(
                    "py-lbl-src", self.target_node, "py-lbl-dst", blocks=[2, 3],
                    request_id="py-lbl", layer_by_layer=True, timeout=WAIT_S,
                    on_event=events.append)
            except fuselink.FuselinkError as e:
                outcome["error"] = e

        sender = threading.Thread(target=run)
        sender.start()
        self.until_started(self.router.layers_ready, "py-lbl", 0)
        for ready in range(1, LAYERS + 1):
            time.sleep(0.05)  # "computing" the next layer
            status = self.router.layers_ready("py-lbl", ready)
            # Nothing past the layers told ready has been sent.
            self.assertLessEqual(status.progress.bytes_done, ready * 2 * BLOCK_BYTES)
        sender.join(WAIT_S)
        self.assertIn("done", outcome, outcome.get("error"))
        done_layers = [e.layer_done.layer for e in events if e.HasField("layer_done")]
        self.assertEqual(sorted(done_layers), list(range(LAYERS)))
        for layer in range(LAYERS):
            for b in (2, 3):
                self.assertEqual(block(dst, layer, b), block(src, layer, b))
        self.assertError(grpc.StatusCode.FAILED_PRECONDITION, "TRANSFER_FINISHED",
                         self.router.layers_ready, "py-lbl", LAYERS)
        # A transfer started whole has every layer ready; an unknown one is unknown.
        self.router.transfer("py-lbl-src", self.target_node, "py-lbl-dst", blocks=[4],
                             request_id="py-whole", timeout=WAIT_S)
        self.assertError(grpc.StatusCode.FAILED_PRECONDITION, "NOT_LAYER_BY_LAYER",
                         self.router.layers_ready, "py-whole", 1)
        self.assertError(grpc.StatusCode.NOT_FOUND, "UNKNOWN_TRANSFER",
                         self.router.layers_ready, "py-none", 1)

    def test_get_transfer_and_cancel(self):
        self.lend(self.source, "py-stop-src", fill=True)
        self.lend(self.target, "py-stop-dst", fill=False)
        outcome = {}

        def run():
            try:
                self.router.transfer("py-stop-src", self.target_node, "py-stop-dst",
                                     blocks=[1], request_id="py-stop",
                                     layer_by_layer=True, timeout=WAIT_S)
            except fuselink.FuselinkError as e:
                outcome["error"] = e

        sender = threading.Thread(target=run)
        sender.start()
        status = self.until_started(self.router.get_transfer, "py-stop")
        self.assertEqual(status.state, agent_pb2.TRANSFER_STATE_RUNNING)
        self.router.cancel("py-stop")
        sender.join(WAIT_S)
        self.assertEqual(outcome["error"].reason, "CANCELLED")
        self.assertEqual(self.router.get_transfer("py-stop").state,
                         agent_pb2.TRANSFER_STATE_CANCELLED)
        # Named with another node as its source, the call goes to that node's agent,
        # which here runs no forwarded calls.
        self.assertError(grpc.StatusCode.PERMISSION_DENIED, "FORWARDING_OFF",
                         self.router.get_transfer, "py-stop", source_node=self.target_node)

    def test_layouts_of_parts_are_checked(self):
        def request(name, parts, sizes, layers=1, blocks=2, **layout):
            r = agent_pb2.RegisterTensorRequest(name=name)
            r.layout.CopyFrom(tensor_pb2.Layout(
                layers=layers, blocks_per_layer=blocks, parts_per_block=len(parts) // layers,
                **layout))
            for region, offset, size in parts:
                r.layout.parts.add(region=region, offset_bytes=offset, bytes=size)
            for size in sizes:
                b = fuselink.HostBuffer(size)
                self.addCleanup(b.close)
                r.regions.add().host.CopyFrom(tensor_pb2.HostMemory(
                    fd_token=send_fd(self.source.handle_socket, b.fd), size_bytes=size))
            return r

        bad = grpc.StatusCode.INVALID_ARGUMENT
        register = lambda r: self.source._call(self.source._stub.RegisterTensor, r)
        cases = [
            ("overlapping parts", request("py-p1", [(0, 0, 64), (0, 64, 64)], [256]),
             "BAD_LAYOUT"),
            ("a region holding no part", request("py-p2", [(0, 0, 64)], [128, 128]),
             "BAD_LAYOUT"),
            ("a part past its region", request("py-p3", [(0, 100, 64)], [128]),
             "LAYOUT_EXCEEDS_MEMORY"),
            ("an unknown region", request("py-p4", [(3, 0, 64)], [128]), "BAD_LAYOUT"),
            ("strides beside parts",
             request("py-p5", [(0, 0, 64)], [128], block_stride_bytes=64), "BAD_LAYOUT"),
        ]
        both = request("py-p6", [(0, 0, 64)], [128])
        both.memory.CopyFrom(both.regions[0])
        cases.append(("memory and regions", both, "BAD_MEMORY"))
        for what, r, reason in cases:
            with self.subTest(what):
                self.assertError(bad, reason, register, r)
        # The agent keeps serving, and none of them was registered.
        self.assertError(grpc.StatusCode.NOT_FOUND, "UNKNOWN_TENSOR", self.source.get_tensor,
                         "py-p1")
        # Checked here: a layer entry that is no pair, a buffer that splits unevenly.
        with fuselink.HostBuffer(100) as odd:
            with self.assertRaises(ValueError):
                self.source.register_kv_layers("py-odd-layers", [odd], BLOCKS)
            with self.assertRaises(ValueError):
                self.source.register_kv_layers("py-odd-layers", [(odd, odd, odd)], BLOCKS)

    def test_a_host_buffer_asks_for_huge_pages(self):
        # Before its first touch, so that a node that allows huge shared pages makes
        # the buffer of them; the advice shows in the mapping's VmFlags as "hg".
        with fuselink.HostBuffer(SIZE_BYTES) as buffer:
            start = "%x-" % ctypes.addressof(ctypes.c_char.from_buffer(buffer.data))
            with open("/proc/self/smaps") as smaps:
                lines = smaps.read().splitlines()
            at = next(i for i, line in enumerate(lines) if line.startswith(start))
            flags = next(line for line in lines[at:] if line.startswith("VmFlags:"))
            self.assertIn(" hg", flags)

    def test_unregister(self):
        with fuselink.HostBuffer(SIZE_BYTES) as buffer:
            self.source.register_kv_cache("py-gone", buffer, LAYERS, BLOCKS)
            self.assertEqual(self.source.get_tensor("py-gone").size_bytes, SIZE_BYTES)
            self.source.unregister("py-gone")
        self.assertError(grpc.StatusCode.NOT_FOUND, "UNKNOWN_TENSOR", self.source.get_tensor,
                         "py-gone")

    def test_each_identity_does_its_part(self):
        self.lend(self.source, "py-roles-src", fill=True)
        self.lend(self.target, "py-roles-dst", fill=False)
        denied = grpc.StatusCode.PERMISSION_DENIED
        # An engine moves nothing, and watches only what it registered.
        self.assertError(denied, "ROLE_REQUIRED", self.source.transfer, "py-roles-src",
                         self.target_node, "py-roles-dst", blocks=[0])
        self.assertError(denied, "ROLE_REQUIRED", self.target.watch)
        # A router lends nothing, and may not take an engine's tensor away.
        with fuselink.HostBuffer(SIZE_BYTES) as buffer:
            self.assertError(denied, "ROLE_REQUIRED", self.router.register_kv_cache,
                             "py-roles-router", buffer, LAYERS, BLOCKS, watch=False)
        self.assertError(denied, "ROLE_REQUIRED", self.router.unregister, "py-roles-src")
        # A tensor whose owner grants another router alone cannot be moved by this one.
        other = ["spiffe://fuselink/router/other"]
        self.lend(self.source, "py-roles-closed", fill=True, readers=other, writers=other)
        self.assertError(denied, "TENSOR_ACCESS", self.router.transfer, "py-roles-closed",
                         self.target_node, "py-roles-dst", blocks=[0], timeout=WAIT_S)

    def test_tls_is_required(self):
        address = os.environ["FL_SOURCE_AGENT"]
        with self.assertRaises(ValueError):
            fuselink.Agent(address)
        with self.assertRaises(ValueError):
            fuselink.Agent(address, tls=self.router_tls, plaintext=True)
        # A plaintext client does not get through the agent's TLS.
        with fuselink.Agent(address, plaintext=True, call_timeout_s=2) as open_client:
            with self.assertRaises(fuselink.FuselinkError) as caught:
                open_client.topology()
            self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        # The agent's certificate names localhost too: a client may check that name.
        named = fuselink.Tls(self.router_tls.cert, self.router_tls.key, self.router_tls.ca,
                             server_name="localhost")
        with fuselink.Agent(address, tls=named) as agent:
            self.assertEqual(agent.topology().node, "node-a")
        wrong = fuselink.Tls(self.router_tls.cert, self.router_tls.key, self.router_tls.ca,
                             server_name="node-z")
        with fuselink.Agent(address, tls=wrong, call_timeout_s=2) as agent:
            with self.assertRaises(fuselink.FuselinkError) as caught:
                agent.topology()
            self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)


if __name__ == "__main__":
    unittest.main()
