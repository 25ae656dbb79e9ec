"""The router of a disaggregated pair: for each prompt it asks the decode engine for
blocks, the prefill engine to prefill into its own and move them there, and the
decode engine to generate. Prints one JSON summary: tokens and time to first token
per request. With --check it also runs every prompt through a single in-process
engine (engine.reference_generate) and exits 1 unless all tokens match exactly.

  router.py --prefill URL --decode URL [--prompts 8 --seed 1 --max_new 16] [--check]

Exit status: 0 all requests served (and matched, with --check), 1 otherwise.
"""

import argparse
import concurrent.futures
import dataclasses
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


def serve(prefill, decode, request_id, prompt, max_new):
    """One request through both engines; its tokens and timings."""
    started = time.monotonic()
    alloc = call(decode, "/allocate", {"n_tokens": len(prompt), "max_new": max_new})
    try:
        pre = call(prefill, "/prefill", {
            "request_id": request_id, "tokens": prompt, "target_node": alloc["node"],
            "target_tensor": alloc["tensor"], "target_blocks": alloc["block_ids"]})
    except Exception:
        call(decode, "/free", {"block_ids": alloc["block_ids"]})
        raise
    first_token_at = time.monotonic()
    gen = call(decode, "/generate", {
        "request_id": request_id, "prompt_len": len(prompt),
        "first_token": pre["first_token"], "block_ids": alloc["block_ids"],
        "max_new": max_new})
    done = time.monotonic()
    return {"id": request_id, "prompt_len": len(prompt), "tokens": gen["tokens"],
            # TTFT: until the first token is in the router's hands. The prefill engine
            # answers once its transfer has completed, so the transfer is counted.
            "ttft_ms": round((first_token_at - started) * 1e3, 3),
            "prefill_ms": pre["prefill_ms"], "transfer_ms": pre["transfer_ms"],
            "kv_wait_ms": gen["wait_ms"], "decode_ms": gen["decode_ms"],
            "total_ms": round((done - started) * 1e3, 3)}


def serve_all(prefill, decode, prompts, max_new, concurrency):
    """Every prompt, `concurrency` at a time; results in prompt order, each a dict
    from serve() or {"id", "error"}."""
    def one(i):
        request_id = f"r{i}"
        try:
            return serve(prefill, decode, request_id, prompts[i], max_new)
        except (EngineError, OSError) as e:
            return {"id": request_id, "prompt_len": len(prompts[i]), "error": str(e)}

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(len(prompts))))


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
    p.add_argument("--check", action="store_true",
                   help="compare with a single engine's tokens; exit 1 on a difference")
    p.add_argument("--device", default="cpu",
                   help="--check: where the single engine runs; the engines' device")
    args = p.parse_args()

    infos = [call(url, "/info") for url in (args.prefill, args.decode)]
    configs = [info["config"] for info in infos]
    if configs[0] != configs[1]:
        sys.exit(f"the engines run different models: {configs[0]} vs {configs[1]}")
    prompts = make_prompts(args.seed, args.prompts, args.min_len, args.max_len,
                           configs[0]["vocab"])
    results = serve_all(args.prefill, args.decode, prompts, args.max_new, args.concurrency)
    ok = all("error" not in r for r in results)
    summary = {"requests": results, "served": sum("error" not in r for r in results)}
    if args.check:
        from model import Config

        config = Config()
        if dataclasses.asdict(config) != configs[0]:
            sys.exit("the engines run another model than model.Config(): cannot check")
        from model import setup_device

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
