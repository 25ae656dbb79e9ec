"""The disaggregated pair in one process, with kv_link.LocalLink standing in for the
two agents: the engines' HTTP servers on threads, the router's code against them, and
every request's tokens compared with the single-engine reference. Then what each bad
request answers, and that blocks come back on every path.

The caches are HostBuffers as in run.sh, so only the send() call differs from the
real path. Needs torch and the fuselink package (PYTHONPATH=build/python); exits 77
without them.

  PYTHONPATH=build/python python3 examples/disagg/standin_test.py -v
"""

import random
import sys
import threading
import unittest

try:
    import torch

    import fuselink
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

import router
from engine import BlockAllocator, DecodeEngine, PrefillEngine, make_server, reference_generate
from kv_link import Arrivals, LocalLink, TransferFailed
from model import Config, Model, PagedKvCache, greedy_decode

BLOCKS = 32
MAX_NEW = 12
# Around block edges: 1 position, a block but one, a block, a block and one, ...
EDGE_LENGTHS = (1, 15, 16, 17, 31, 32, 33, 80)


def host_cache(config, num_blocks):
    buffers = [fuselink.HostBuffer(config.layer_bytes(num_blocks)) for _ in range(config.layers)]
    return PagedKvCache(config, num_blocks, [b.data for b in buffers]), buffers


class Pair:
    """A prefill and a decode engine joined by `send` (default: a LocalLink), each
    behind its HTTP server."""

    def __init__(self, config, wait_s=10, send=None):
        self.prefill_cache, self._pb = host_cache(config, BLOCKS)
        self.decode_cache, self._db = host_cache(config, BLOCKS)
        self.arrivals = Arrivals()
        link = LocalLink(self.prefill_cache, self.decode_cache, "kv-decode", self.arrivals)
        self.prefill = PrefillEngine(Model(config, self.prefill_cache), BlockAllocator(BLOCKS),
                                     send or link)
        self.decode = DecodeEngine(Model(config, self.decode_cache), BlockAllocator(BLOCKS),
                                   self.arrivals, "local", "kv-decode", wait_s)
        info = lambda: {"config": {}}  # noqa: E731
        self.servers = [make_server(e.routes(), info) for e in (self.prefill, self.decode)]
        for s in self.servers:
            threading.Thread(target=s.serve_forever, daemon=True).start()
        self.prefill_url, self.decode_url = (f"http://127.0.0.1:{s.server_port}"
                                             for s in self.servers)

    def close(self):
        for s in self.servers:
            s.shutdown()
            s.server_close()


class LoadTest(unittest.TestCase):
    def test_arrivals_fall_in_on_periods_at_the_rate(self):
        times = router.arrival_times(7, 4000, rps=50, on_s=1.0, off_s=3.0)
        self.assertEqual(times, sorted(times))
        self.assertTrue(all(t % 4.0 < 1.0 for t in times), "an arrival while off")
        on_time = times[-1] // 4.0 + min(times[-1] % 4.0, 1.0)
        self.assertAlmostEqual(len(times) / on_time, 50, delta=3)
        self.assertEqual(times, router.arrival_times(7, 4000, 50, 1.0, 3.0))
        always_on = router.arrival_times(7, 100, rps=50, on_s=1.0, off_s=0.0)
        self.assertLess(always_on[-1], 4.0)

    def test_percentiles_and_shares(self):
        self.assertEqual(router.percentile([5, 1, 3], 50), 3)
        self.assertEqual(router.percentile(list(range(1, 101)), 99), 99)
        self.assertEqual(router.percentile([7], 99), 7)
        results = [{"ttft_ms": 10.0, "queue_ms": 1.0, "prefill_ms": 4.0, "transfer_ms": 5.0},
                   {"ttft_ms": 30.0, "queue_ms": 3.0, "prefill_ms": 6.0, "transfer_ms": 21.0},
                   {"id": "r2", "error": "lost"}]
        summary = router.latency_summary(results)
        self.assertEqual(summary["ttft_ms"], {"p50": 10.0, "p99": 30.0, "mean": 20.0})
        self.assertEqual(summary["share_of_ttft"],
                         {"queue": 0.1, "prefill": 0.25, "transfer": 0.65})
        self.assertEqual(router.latency_summary([{"error": "lost"}]), {})


class StandinTest(unittest.TestCase):
    config = Config()

    def pair(self, **kwargs):
        pair = Pair(self.config, **kwargs)
        self.addCleanup(pair.close)
        return pair

    def assertStatus(self, status, url, path, body):
        with self.assertRaises(router.EngineError) as caught:
            router.call(url, path, body)
        self.assertEqual(caught.exception.status, status, str(caught.exception))

    def test_tokens_match_the_single_engine(self):
        rng = random.Random(7)
        prompts = [[rng.randrange(self.config.vocab) for _ in range(n)] for n in EDGE_LENGTHS]
        prompts += router.make_prompts(3, 8, 1, 80, self.config.vocab)
        pair = self.pair()
        results = router.serve_all(pair.prefill_url, pair.decode_url, prompts, MAX_NEW, 3)
        self.assertEqual([r.get("error") for r in results], [None] * len(prompts))
        self.assertTrue(router.check(results, prompts, MAX_NEW, self.config),
                        [r for r in results if not r["match"]])
        # Different prompts, different tokens: the model is not stuck on one answer.
        self.assertGreater(len({tuple(r["tokens"]) for r in results}), len(prompts) // 2)
        for engine in (pair.prefill, pair.decode):
            self.assertEqual(engine.allocator.free_count(), BLOCKS)

    def test_copied_blocks_give_the_same_bits(self):
        prompt = list(range(40))
        pair = self.pair()
        pair.prefill.model.prefill(prompt, [0, 1, 2])
        pair.prefill_cache.copy_blocks([0, 1, 2], pair.decode_cache, [9, 4, 6])
        here = pair.prefill.model.decode_step(7, len(prompt), [0, 1, 2])
        there = pair.decode.model.decode_step(7, len(prompt), [9, 4, 6])
        self.assertTrue(torch.equal(here, there))

    def test_a_block_left_behind_changes_the_tokens(self):
        # The check has teeth: a prompt block that did not arrive, and decoding differs.
        prompt = list(range(40))
        expected = reference_generate(self.config, [prompt], MAX_NEW)[0]
        pair = self.pair()
        first = int(pair.prefill.model.prefill(prompt, [0, 1, 2]).argmax())
        pair.prefill_cache.copy_blocks([0, 2], pair.decode_cache, [9, 6])
        got = greedy_decode(pair.decode.model, first, len(prompt), [9, 4, 6, 7], MAX_NEW)
        self.assertNotEqual(got, expected)

    def test_on_layer_follows_each_layers_kv(self):
        cache, _ = host_cache(self.config, 4)
        model = Model(self.config, cache)
        seen = []

        def on_layer(layer):
            # This layer's K and V for the prompt are in place, the next layer's not yet.
            self.assertTrue(cache.layers[layer][:, 2, :5].abs().sum(-1).all())
            if layer + 1 < self.config.layers:
                self.assertFalse(cache.layers[layer + 1].any())
            seen.append(layer)

        model.prefill([5, 6, 7, 8, 9], [2], on_layer=on_layer)
        self.assertEqual(seen, list(range(self.config.layers)))

    def test_bad_requests(self):
        pair = self.pair()
        d, p = pair.decode_url, pair.prefill_url
        self.assertStatus(503, d, "/allocate", {"n_tokens": BLOCKS * 16 + 1, "max_new": 1})
        self.assertStatus(400, d, "/allocate", {"n_tokens": 0, "max_new": 1})
        self.assertStatus(400, d, "/allocate", {"n_tokens": True, "max_new": 1})
        self.assertStatus(400, p, "/prefill", {"request_id": "x", "tokens": list(range(17)),
                                               "target_node": "local",
                                               "target_tensor": "kv-decode",
                                               "target_blocks": [3]})
        self.assertStatus(400, p, "/prefill", {"request_id": "x", "tokens": [self.config.vocab],
                                               "target_node": "local",
                                               "target_tensor": "kv-decode",
                                               "target_blocks": [3]})
        self.assertStatus(400, d, "/generate", {"request_id": "x", "prompt_len": 3,
                                                "first_token": 1, "block_ids": [5],
                                                "max_new": 2})
        self.assertStatus(400, d, "/free", {"block_ids": [5]})
        self.assertStatus(404, d, "/prefill", {"request_id": "x"})
        self.assertEqual(pair.prefill.allocator.free_count(), BLOCKS)
        self.assertEqual(pair.decode.allocator.free_count(), BLOCKS)

    def test_kv_that_never_lands_times_out_and_frees(self):
        pair = self.pair(wait_s=0.2)
        blocks = router.call(pair.decode_url, "/allocate", {"n_tokens": 20, "max_new": 4})
        self.assertStatus(504, pair.decode_url, "/generate", {
            "request_id": "x", "prompt_len": 20, "first_token": 1,
            "block_ids": blocks["block_ids"], "max_new": 4})
        self.assertEqual(pair.decode.allocator.free_count(), BLOCKS)

    def test_failed_transfer_frees_the_prefill_blocks(self):
        def fail(request_id, *_):
            raise TransferFailed(f"request {request_id}: the wire broke")

        pair = self.pair(send=fail)
        results = router.serve_all(pair.prefill_url, pair.decode_url, [[1, 2, 3]], MAX_NEW, 1)
        self.assertIn("502", results[0]["error"])
        self.assertEqual(pair.prefill.allocator.free_count(), BLOCKS)
        # The router gave the decode blocks back.
        self.assertEqual(pair.decode.allocator.free_count(), BLOCKS)

    def test_failed_arrival_fails_generate(self):
        pair = self.pair()
        ids = router.call(pair.decode_url, "/allocate", {"n_tokens": 3, "max_new": 2})["block_ids"]
        pair.arrivals.landed(ids[:1], error="DATA_LOSS: a NIC went down")
        self.assertStatus(502, pair.decode_url, "/generate", {
            "request_id": "x", "prompt_len": 3, "first_token": 1, "block_ids": ids,
            "max_new": 2})
        self.assertEqual(pair.decode.allocator.free_count(), BLOCKS)

    def test_an_old_arrival_is_not_taken_for_a_new_request(self):
        arrivals = Arrivals()
        arrivals.landed([4, 5])
        arrivals.forget([5, 9])  # what /allocate does with the blocks it hands out
        with self.assertRaises(TimeoutError):
            arrivals.wait([4, 5], 0.05)


if __name__ == "__main__":
    unittest.main()
