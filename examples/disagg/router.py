"""The router of a disaggregated pair, an asyncio program as serving routers are: for
each prompt it asks the decode engine for blocks, the prefill engine to prefill, the
prompt's K/V moved from one into the other, and the decode engine to generate.
Prints one JSON summary: tokens and time to first token per request. With --check it
also runs every prompt through a single in-process engine
(engine.reference_generate) and exits 1 unless all tokens match exactly.

  router.py --prefill URL --decode URL [--prompts 8 --seed 1 --max_new 16] [--check]
            [--poisson RPS [--on_s S --off_s S]]
            [--agent ADDR --tls_dir PKI [--router_name prefill] [--layer_by_layer]]

With --agent the router moves the K/V itself through the prefill node's agent, with
fuselink.aio: it allocates blocks on both engines, has the prefill engine compute
into its own, runs the transfer (`async for event in agent.transfer(...)`), then frees
them; with --layer_by_layer the transfer starts first and the prefill engine tells
the agent each layer it computed. Without --agent the prefill engine moves them (its
own agent client, or the stand-in's copy). Its engine calls are blocking HTTP
(urllib) run on threads; the transfers share the one event loop.

Without --poisson, --concurrency requests are in flight at a time. With it, requests
arrive open-loop, in a Poisson process of RPS per second while the load is on, on for
--on_s seconds, then off for --off_s, and so on (an on-off load); the summary gives
the time to first token's p50 and p99 and the transfer's share of it.

Exit status: 0 all requests served (and matched, with --check), 1 otherwise.
"""

import argparse
import asyncio
import concurrent.futures
import json
import random
import sys
import time
import urllib.error
import urllib.request

HTTP_TIMEOUT_S = 60  # one engine call; /generate includes waiting for the KV


class EngineError(Exception):
    def __init__(self, url, status, message):
        super().__init__(f"{url}: {status} {message}")
        self.status = status


def call(base, path, body=None, timeout_s=HTTP_TIMEOUT_S):
    """POSTs `body` (GET when None) as JSON to base+path; the reply's JSON object.
    Raises EngineError for an answer other than 200."""
    url = base + path
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as e:
        try:
            message = json.loads(e.read()).get("error", "")
        except ValueError:
            message = e.reason
        raise EngineError(url, e.code, message) from None


def make_prompts(seed, count, min_len, max_len, vocab):
    """`count` prompts of random tokens, their lengths uniform in [min_len, max_len]."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(min_len, max_len))]
            for _ in range(count)]


def arrival_times(seed, count, rps, on_s, off_s):
    """`count` arrival times (seconds from the start) of a Poisson process of `rps`
    per second that runs only while the load is on: on for `on_s`, off for `off_s`,
    repeating (off_s 0: always on)."""
    rng = random.Random(seed)
    times, busy = [], 0.0  # busy: time spent in on periods so far
    for _ in range(count):
        busy += rng.expovariate(rps)
        periods, into = divmod(busy, on_s)
        times.append(periods * (on_s + off_s) + into)
    return times


def percentile(values, p):
    """The nearest-rank `p`-th percentile of `values` (non-empty)."""
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * p // 100) - 1)]


async def acall(base, path, body=None):
    """call() on a thread of the loop's executor: the loop goes on meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(None, call, base, path, body)


class AgentMover:
    """Moves a prompt's K/V through the prefill node's agent (a fuselink.aio.Agent
    speaking as the identity both caches grant): blocks from the prefill engine's
    /allocate, one transfer into the decode engine's, the blocks freed after."""

    def __init__(self, agent, layer_by_layer, timeout_s):
        self.agent = agent
        self.layer_by_layer = layer_by_layer
        self.timeout_s = timeout_s

    async def prefill_and_move(self, prefill, request_id, prompt, target):
        """/prefill's reply for `prompt` and the transfer's ms that did not overlap
        the computation, once its blocks landed in `target` (decode's /allocate)."""
        own = await acall(prefill, "/allocate", {"n_tokens": len(prompt)})
        blocks = own["block_ids"]
        transfer = self.agent.transfer(own["tensor"], target["node"], target["tensor"],
                                       blocks=blocks, target_blocks=target["block_ids"][:len(blocks)],
                                       layer_by_layer=self.layer_by_layer, timeout=self.timeout_s)
        body = {"request_id": request_id, "tokens": prompt, "block_ids": blocks}
        moving = None
        try:
            if self.layer_by_layer:  # running while the layers are computed
                moving = asyncio.ensure_future(transfer)
                body["transfer_id"] = transfer.request_id
            pre = await acall(prefill, "/prefill", body)
            computed = time.monotonic()
            final = await (moving or transfer)
            pre["per_nic"] = {n.nic: n.bytes for n in final.completed.per_nic}
            return pre, round((time.monotonic() - computed) * 1e3, 3)
        except BaseException:
            if moving is not None and not moving.done():
                await self.agent.cancel(transfer.request_id)
                await asyncio.gather(moving, return_exceptions=True)
            raise
        finally:
            await acall(prefill, "/free", {"block_ids": blocks})


async def serve(prefill, decode, request_id, prompt, max_new, mover=None):
    """One request through both engines; its tokens and timings. The K/V moves by
    `mover` (an AgentMover), or by the prefill engine itself when None."""
    started = time.monotonic()
    alloc = await acall(decode, "/allocate", {"n_tokens": len(prompt), "max_new": max_new})
    try:
        if mover is None:
            pre = await acall(prefill, "/prefill", {
                "request_id": request_id, "tokens": prompt, "target_node": alloc["node"],
                "target_tensor": alloc["tensor"], "target_blocks": alloc["block_ids"]})
        else:
            pre, transfer_ms = await mover.prefill_and_move(prefill, request_id, prompt,
                                                            alloc)
            pre["transfer_ms"] = transfer_ms
    except Exception:
        await acall(decode, "/free", {"block_ids": alloc["block_ids"]})
        raise
    first_token_at = time.monotonic()
    gen = await acall(decode, "/generate", {
        "request_id": request_id, "prompt_len": len(prompt),
        "first_token": pre["first_token"], "block_ids": alloc["block_ids"],
        "max_new": max_new})
    done = time.monotonic()
    return {"id": request_id, "prompt_len": len(prompt), "tokens": gen["tokens"],
            # TTFT: until the first token is in the router's hands, the transfer
            # counted (the prefill engine answers, or the router's transfer ends, once
            # the blocks have landed).
            "ttft_ms": round((first_token_at - started) * 1e3, 3),
            "queue_ms": pre["queue_ms"], "prefill_ms": pre["prefill_ms"],
            "transfer_ms": pre["transfer_ms"],
            "kv_wait_ms": gen["wait_ms"], "decode_ms": gen["decode_ms"],
            "total_ms": round((done - started) * 1e3, 3),
            # Bytes by NIC, where the router moved the K/V (the transfer's final event).
            **({"per_nic": pre["per_nic"]} if "per_nic" in pre else {})}


async def serve_all_async(prefill, decode, prompts, max_new, concurrency, times=None,
                          mover=None):
    """serve_all() on the running loop."""
    start = time.monotonic()
    workers = concurrency if times is None else len(prompts)
    # Each request blocks a thread only in its HTTP calls; enough for all at once.
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max(1, 2 * workers)))
    gate = asyncio.Semaphore(max(1, workers))
    failures = (EngineError, OSError)
    if mover is not None:
        import fuselink

        failures += (fuselink.FuselinkError,)

    async def one(i):
        request_id = f"r{i}"
        if times is not None:
            await asyncio.sleep(max(0.0, start + times[i] - time.monotonic()))
        async with gate:
            try:
                return await serve(prefill, decode, request_id, prompts[i], max_new, mover)
            except failures as e:
                return {"id": request_id, "prompt_len": len(prompts[i]), "error": str(e)}

    return await asyncio.gather(*(one(i) for i in range(len(prompts))))


def serve_all(prefill, decode, prompts, max_new, concurrency, times=None):
    """Every prompt, `concurrency` at a time, or each at its arrival time in `times`
    (seconds from now; open-loop: nothing waits for earlier requests); results in
    prompt order, each a dict from serve() or {"id", "error"}. The prefill engine
    moves the K/V (main() passes an AgentMover to serve_all_async instead)."""
    return asyncio.run(serve_all_async(prefill, decode, prompts, max_new, concurrency, times))


def latency_summary(results):
    """TTFT p50/p99/mean over the served requests, and which share of all their TTFT
    was queueing for the prefill engine, computing, and the transfer."""
    served = [r for r in results if "error" not in r]
    if not served:
        return {}
    ttft = [r["ttft_ms"] for r in served]
    total = sum(ttft)
    return {"ttft_ms": {"p50": percentile(ttft, 50), "p99": percentile(ttft, 99),
                        "mean": round(total / len(ttft), 3)},
            "share_of_ttft": {k: round(sum(r[f"{k}_ms"] for r in served) / total, 3)
                              for k in ("queue", "prefill", "transfer")}}


def check(results, prompts, max_new, config, device="cpu"):
    """Marks each result with `match` against the single-engine reference, run on
    `device` (the engines' own, for the same kernels); True when all match."""
    from engine import reference_generate

    expected = reference_generate(config, prompts, max_new, device)
    for result, want in zip(results, expected):
        result["match"] = result.get("tokens") == want
        if not result["match"]:
            result["expected"] = want
    return all(r["match"] for r in results)


async def route(args, prompts, times):
    """Every prompt served, on this loop; with --agent through an AgentMover."""
    if not args.agent:
        return await serve_all_async(args.prefill, args.decode, prompts, args.max_new,
                                     args.concurrency, times)
    import fuselink
    import fuselink.aio

    tls = fuselink.Tls.from_dir(args.tls_dir, "router", args.router_name)
    async with fuselink.aio.Agent(args.agent, tls=tls) as agent:
        mover = AgentMover(agent, args.layer_by_layer, args.wait_s)
        return await serve_all_async(args.prefill, args.decode, prompts, args.max_new,
                                     args.concurrency, times, mover)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefill", required=True, help="the prefill engine's URL")
    p.add_argument("--decode", required=True, help="the decode engine's URL")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--seed", type=int, default=1, help="of the prompts' lengths and tokens")
    p.add_argument("--min_len", type=int, default=1)
    p.add_argument("--max_len", type=int, default=80)
    p.add_argument("--max_new", type=int, default=16, help="tokens per request")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--poisson", type=float, metavar="RPS",
                   help="open-loop arrivals, RPS per second while the load is on")
    p.add_argument("--on_s", type=float, default=2.0, help="--poisson: on periods")
    p.add_argument("--off_s", type=float, default=0.0, help="--poisson: off periods")
    p.add_argument("--check", action="store_true",
                   help="compare with a single engine's tokens; exit 1 on a difference")
    p.add_argument("--device", default="cpu",
                   help="--check: where the single engine runs; the engines' device")
    p.add_argument("--agent", help="the prefill node's agent: the router moves the K/V")
    p.add_argument("--tls_dir", help="--agent: scripts/certs.sh's folder")
    p.add_argument("--router_name", default="prefill",
                   help="--agent: moves as router/NAME, whom both caches grant")
    p.add_argument("--layer_by_layer", action="store_true",
                   help="--agent: each layer sent as soon as the prefill engine computed it")
    p.add_argument("--wait_s", type=float, default=30, help="--agent: bound on a transfer")
    args = p.parse_args()
    if args.agent and not args.tls_dir:
        p.error("--agent needs --tls_dir")

    infos = [call(url, "/info") for url in (args.prefill, args.decode)]
    configs = [info["config"] for info in infos]
    if configs[0] != configs[1]:
        sys.exit(f"the engines run different models: {configs[0]} vs {configs[1]}")
    prompts = make_prompts(args.seed, args.prompts, args.min_len, args.max_len,
                           configs[0]["vocab"])
    times = None
    if args.poisson is not None:
        if args.poisson <= 0 or args.on_s <= 0 or args.off_s < 0:
            sys.exit("--poisson and --on_s must be > 0, --off_s >= 0")
        times = arrival_times(args.seed, len(prompts), args.poisson, args.on_s, args.off_s)
    results = asyncio.run(route(args, prompts, times))
    ok = all("error" not in r for r in results)
    summary = {"requests": results, "served": sum("error" not in r for r in results),
               **latency_summary(results)}
    if args.check:
        from model import Config, setup_device

        try:
            config = Config(**configs[0])
        except TypeError as e:
            sys.exit(f"the engines run a model model.Config cannot describe: {e}")

        # Token-exact only on the engines' device: another one computes other bits.
        want = str(setup_device(args.device))
        devices = [info.get("device", "cpu") for info in infos]
        if any(d != want for d in devices):
            sys.exit(f"the engines run on {devices}, the check on {want}: cannot check")
        summary["all_match"] = check(results, prompts, args.max_new, config, args.device)
        ok = ok and summary["all_match"]
    print(json.dumps(summary))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
