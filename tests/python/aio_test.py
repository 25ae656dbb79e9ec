"""fuselink.aio against two real agents (started by client_test.sh, as client_test.py).

One event loop per test, as a router runs one: a transfer's events through `async
for`, a cancel in the middle of a stream, 64 transfers at once from the loop with
every target block checked, the watch that sees them land, and errors with their
codes and reasons. Host memory, mutual TLS, the default policy: engine-e1 lends,
router-r1 moves. The agents run with --max_transfers_per_router=64 so that all 64
are in flight together (the default share is 32).

Environment: client_test.py's, and FL_INSTALLED_IN (the venv fuselink must come from).
"""

import asyncio
import os
import unittest

import grpc

import fuselink
import fuselink.aio
from fuselink.v1 import agent_pb2

LAYERS = 2
BLOCKS = 64
BLOCK_BYTES = 16 << 10
SIZE_BYTES = LAYERS * BLOCKS * BLOCK_BYTES
CONCURRENT = 64  # transfers in flight at once, one block each
WAIT_S = 30


def block(buffer, layer, index):
    begin = (layer * BLOCKS + index) * BLOCK_BYTES
    return buffer.data[begin:begin + BLOCK_BYTES]


class AioTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        pki = os.environ["FL_PKI"]
        engine_tls = fuselink.Tls.from_dir(pki, "engine", "e1")
        self.source = fuselink.aio.Agent(os.environ["FL_SOURCE_AGENT"], tls=engine_tls,
                                         handle_socket=os.environ["FL_SOURCE_SOCKET"])
        self.target = fuselink.aio.Agent(os.environ["FL_TARGET_AGENT"], tls=engine_tls,
                                         handle_socket=os.environ["FL_TARGET_SOCKET"])
        self.router = fuselink.aio.Agent(os.environ["FL_SOURCE_AGENT"],
                                         tls=fuselink.Tls.from_dir(pki, "router", "r1"))
        self.target_node = os.environ["FL_TARGET_NODE"]
        for agent in (self.source, self.target, self.router):
            self.addAsyncCleanup(agent.close)

    async def lend(self, agent, name, fill, watch=True):
        buffer = fuselink.HostBuffer(SIZE_BYTES, name)
        if fill:
            buffer.data[:] = os.urandom(SIZE_BYTES)
        self.addCleanup(buffer.close)
        tensor = await agent.register_kv_cache(name, buffer, LAYERS, BLOCKS, watch=watch)
        self.addAsyncCleanup(agent.unregister, name)
        self.assertEqual(tensor.layout.block_bytes, BLOCK_BYTES)
        return buffer

    async def assertError(self, code, reason, awaitable):
        with self.assertRaises(fuselink.FuselinkError) as caught:
            await awaitable
        self.assertEqual((caught.exception.code, caught.exception.reason), (code, reason),
                         str(caught.exception))
        return caught.exception

    def test_the_package_is_the_installed_one(self):
        venv = os.environ.get("FL_INSTALLED_IN")
        if not venv:
            self.skipTest("run from the build tree (FL_INSTALLED_IN unset)")
        where = os.path.realpath(fuselink.aio.__file__)
        self.assertTrue(where.startswith(os.path.realpath(venv) + os.sep), where)

    async def test_events_stream_and_bytes_land(self):
        src = await self.lend(self.source, "aio-src", fill=True)
        dst = await self.lend(self.target, "aio-dst", fill=False)
        transfer = self.router.transfer("aio-src", self.target_node, "aio-dst",
                                        blocks=[1, 2], target_blocks=[5, 6], timeout=WAIT_S)
        events = [event async for event in transfer]
        self.assertTrue(events[0].HasField("accepted"), events[0])
        self.assertTrue(events[-1].HasField("completed"), events[-1])
        self.assertIs(transfer.final, events[-1])
        self.assertEqual(events[-1].completed.total_bytes, 2 * LAYERS * BLOCK_BYTES)
        landed = await self.target.wait_for_transfer("aio-dst", timeout=WAIT_S)
        self.assertEqual((landed.code, landed.transfer_id), (0, events[-1].transfer_id))
        for layer in range(LAYERS):
            self.assertEqual(block(dst, layer, 5), block(src, layer, 1))
            self.assertEqual(block(dst, layer, 6), block(src, layer, 2))
        # Awaited instead of iterated: only the final event; every block by default.
        done = await self.router.transfer("aio-src", self.target_node, "aio-dst",
                                          timeout=WAIT_S)
        self.assertEqual(done.completed.total_bytes, SIZE_BYTES)
        self.assertEqual(bytes(dst.data), bytes(src.data))

    async def test_cancel_in_the_middle_of_a_stream(self):
        await self.lend(self.source, "aio-stop-src", fill=True)
        dst = await self.lend(self.target, "aio-stop-dst", fill=False)
        # Layer by layer with no layer ready: it runs until cancelled.
        transfer = self.router.transfer("aio-stop-src", self.target_node, "aio-stop-dst",
                                        blocks=[0, 1], layer_by_layer=True, timeout=WAIT_S)
        seen = []
        with self.assertRaises(fuselink.FuselinkError) as caught:
            async for event in transfer:
                seen.append(event)
                if len(seen) == 1:
                    self.assertTrue(event.HasField("accepted"), event)
                    status = await self.router.get_transfer(transfer.request_id)
                    self.assertEqual(status.state, agent_pb2.TRANSFER_STATE_RUNNING)
                    await self.router.cancel(transfer.request_id)
        self.assertEqual(caught.exception.reason, "CANCELLED", str(caught.exception))
        self.assertIsNone(transfer.final)
        status = await self.router.get_transfer(transfer.request_id)
        self.assertEqual(status.state, agent_pb2.TRANSFER_STATE_CANCELLED)
        with self.assertRaises(fuselink.FuselinkError):  # the target heard it end
            await self.target.wait_for_transfer("aio-stop-dst", timeout=WAIT_S)
        self.assertEqual(bytes(dst.data), bytes(SIZE_BYTES))

    async def test_many_transfers_from_one_loop(self):
        src = await self.lend(self.source, "aio-many-src", fill=True)
        dst = await self.lend(self.target, "aio-many-dst", fill=False, watch=False)
        # Source block b into target block BLOCKS-1-b, each its own transfer, layer by
        # layer so that none can end before all are in flight together.
        transfers = [self.router.transfer("aio-many-src", self.target_node, "aio-many-dst",
                                          blocks=[b], target_blocks=[BLOCKS - 1 - b],
                                          layer_by_layer=True, timeout=WAIT_S)
                     for b in range(CONCURRENT)]
        streams = [t.__aiter__() for t in transfers]

        async def rest(stream):
            async for _ in stream:
                pass

        async with self.target.watch("aio-many-dst") as watch:
            firsts = await asyncio.gather(*(s.__anext__() for s in streams))
            self.assertTrue(all(e.HasField("accepted") for e in firsts))
            statuses = await asyncio.gather(*(self.router.get_transfer(t.request_id)
                                              for t in transfers))
            self.assertEqual({s.state for s in statuses}, {agent_pb2.TRANSFER_STATE_RUNNING})
            await asyncio.gather(*(self.router.layers_ready(t.request_id, LAYERS)
                                   for t in transfers))
            await asyncio.gather(*(rest(s) for s in streams))
            landed = []
            async for event in watch:
                self.assertEqual(event.code, 0, event.message)
                landed.append(event.transfer_id)
                if len(landed) == CONCURRENT:
                    break
        self.assertEqual(sorted(landed), sorted(t.final.transfer_id for t in transfers))
        self.assertEqual(len(set(landed)), CONCURRENT)
        for b in range(CONCURRENT):
            for layer in range(LAYERS):
                self.assertEqual(block(dst, layer, BLOCKS - 1 - b), block(src, layer, b),
                                 f"layer {layer}, source block {b}")

    async def test_errors_carry_code_and_reason(self):
        await self.lend(self.source, "aio-err-src", fill=True)
        await self.assertError(grpc.StatusCode.OUT_OF_RANGE, "BLOCK_OUT_OF_RANGE",
                               self.router.transfer("aio-err-src", self.target_node, "x",
                                                    blocks=[BLOCKS]))
        await self.assertError(grpc.StatusCode.NOT_FOUND, "UNKNOWN_TENSOR",
                               self.router.transfer("aio-no-such", self.target_node, "x",
                                                    blocks=[0]))
        await self.assertError(grpc.StatusCode.NOT_FOUND, "UNKNOWN_TRANSFER",
                               self.router.get_transfer("aio-no-such-transfer"))
        # An engine may watch only its own tensors: refused while the watch opens.
        await self.assertError(grpc.StatusCode.NOT_FOUND, "UNKNOWN_TENSOR",
                               self.target.watch("aio-not-registered"))
        with self.assertRaises(TimeoutError):
            await self.source.wait_for_transfer("aio-err-src", timeout=0.2)
        with self.assertRaises(ValueError):  # the other node's tensor: blocks needed
            await self.router.transfer("t", self.target_node, "t", source_node="node-b")
        with self.assertRaises(ValueError):
            fuselink.aio.Agent(os.environ["FL_SOURCE_AGENT"])  # neither TLS nor plaintext


if __name__ == "__main__":
    unittest.main()
