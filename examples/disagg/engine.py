"""A prefill or a decode engine of the model in model.py, behind a small HTTP/JSON API.

Each engine owns a paged KV cache whose layers are views over fuselink.HostBuffers
(memfds) or, with --device cuda, CUDA tensors of their own (exported by CUDA IPC),
lends it to its node's agent without copying (register_kv_layers), and hands out its
blocks with a BlockAllocator.

  decode   POST /allocate {n_tokens, max_new}            -> {block_ids, node, tensor}
           POST /generate {request_id, prompt_len, first_token, block_ids, max_new}
                waits until the prompt's K/V landed in block_ids, decodes greedily,
                frees the blocks                           -> {tokens, wait_ms, decode_ms}
           POST /free {block_ids}                         (a request given up on)
  prefill  POST /prefill {request_id, tokens, target_node, target_tensor, target_blocks}
                prefills into blocks of its own, has its agent move them into the
                first target_blocks, frees them            -> {first_token, prefill_ms,
                                                               transfer_ms}
           POST /allocate {n_tokens}                       -> {block_ids, node, tensor}
           POST /prefill {request_id, tokens, block_ids[, transfer_id]}
                prefills into blocks from /allocate and keeps them for whoever moves
                them (the router, router.py --agent); with transfer_id, tells the
                agent each layer computed (that layer-by-layer transfer's LayersReady)
                                                           -> {first_token, prefill_ms}
           POST /free {block_ids}                         (once they were moved)
  both     GET /info                                       -> {role, config, ...}

Errors answer {"error": text}: 400 a bad request, 503 no free blocks, 502 the KV
transfer failed, 504 the KV did not land in time.

  engine.py --role decode --agent ADDR --handle_socket SOCK --tls_dir PKI --ready_file F
  engine.py --reference [--device cuda] < {"prompts": [[tok, ...], ...], "max_new": N}
"""

import argparse
import dataclasses
import json
import os
import signal
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from kv_link import AgentSender, Arrivals, TransferFailed, follow_watch
from model import PRESETS, PagedKvCache, greedy_decode, make_model, positions_needed, setup_device

MAX_BODY_BYTES = 1 << 20  # far more than any prompt here; no request reads without end
DEFAULT_BLOCKS = 64  # per engine: 8 requests of up to 128 positions at once


class BadRequest(ValueError):
    pass


class OutOfBlocks(Exception):
    pass


class BlockAllocator:
    """Block ids 0..num_blocks-1 of one cache, each free or held by one request.
    Thread-safe."""

    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        self._lock = threading.Lock()
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: lowest ids first
        self._held = set()

    def allocate(self, count):
        with self._lock:
            if count > len(self._free):
                raise OutOfBlocks(f"{count} blocks asked, {len(self._free)} free")
            ids = [self._free.pop() for _ in range(count)]
            self._held.update(ids)
        return ids

    def check_held(self, ids):
        """BadRequest unless every id is held (and none twice)."""
        with self._lock:
            if len(set(ids)) != len(ids) or not self._held.issuperset(ids):
                raise BadRequest(f"blocks {ids} are not all allocated")

    def free(self, ids):
        with self._lock:
            if len(set(ids)) != len(ids) or not self._held.issuperset(ids):
                raise BadRequest(f"blocks {ids} are not all allocated")
            self._held.difference_update(ids)
            self._free.extend(reversed(ids))

    def free_count(self):
        with self._lock:
            return len(self._free)


def _ms(seconds):
    return round(seconds * 1e3, 3)


def _int(body, name, low, high=None):
    value = body.get(name)
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise BadRequest(f"{name} must be an integer {bound}, not {value!r}")
    return value


def _ints(body, name, low, high):
    values = body.get(name)
    if not isinstance(values, list) or not values:
        raise BadRequest(f"{name} must be a non-empty list of integers")
    for v in values:
        if type(v) is not int or not low <= v <= high:
            raise BadRequest(f"{name}: {v!r} is not an integer in [{low}, {high}]")
    return values


def _str(body, name):
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{name} must be a non-empty string")
    return value


class PrefillEngine:
    """Runs prompts into its own blocks and sends their K/V to the decode side."""

    def __init__(self, model, allocator, send, layer_by_layer=False, node="", tensor=""):
        self.model = model
        self.allocator = allocator
        self.node = node  # where its cache is lent, and under which name (/allocate)
        self.tensor = tensor
        self.send = send  # kv_link's send(); returns once the blocks have landed
        # Send each layer as soon as it is computed (send.start), not all at the end.
        self.layer_by_layer = layer_by_layer
        # One prefill computes at a time, as an engine's one batch does; the transfers
        # of earlier prompts go on meanwhile.
        self._compute = threading.Lock()

    def allocate(self, body):
        ids = self.allocator.allocate(self.model.config.blocks_for(_int(body, "n_tokens", 1)))
        return {"block_ids": ids, "node": self.node, "tensor": self.tensor}

    def free(self, body):
        self.allocator.free(_ints(body, "block_ids", 0, self.allocator.num_blocks - 1))
        return {}

    def prefill(self, body):
        if "block_ids" in body:
            return self.prefill_held(body)
        config = self.model.config
        request_id = _str(body, "request_id")
        tokens = _ints(body, "tokens", 0, config.vocab - 1)
        target_node = _str(body, "target_node")
        target_tensor = _str(body, "target_tensor")
        target_blocks = _ints(body, "target_blocks", 0, 1 << 31)
        count = config.blocks_for(len(tokens))
        if len(target_blocks) < count:
            raise BadRequest(f"{len(tokens)} tokens need {count} target blocks, "
                             f"not {len(target_blocks)}")
        blocks = self.allocator.allocate(count)
        cuda = self.model.device.type == "cuda"
        try:
            arrived = time.monotonic()
            layered = on_layer = None
            with self._compute:
                started = time.monotonic()
                if self.layer_by_layer:
                    layered = self.send.start(blocks, target_node, target_tensor,
                                              target_blocks[:count])

                    def on_layer(layer):
                        if cuda:  # the agent reads the layer straight from the GPU
                            torch.cuda.synchronize(self.model.device)
                        layered.ready(layer + 1)

                first_token = int(self.model.prefill(tokens, blocks,
                                                     on_layer=on_layer).argmax())
                if cuda and layered is None:
                    # The agent reads the blocks straight from the GPU: every write to
                    # them must be complete before the transfer starts.
                    torch.cuda.synchronize(self.model.device)
                computed = time.monotonic()
            if layered is not None:
                layered.wait(request_id)
            else:
                self.send(request_id, blocks, target_node, target_tensor,
                          target_blocks[:count])
            sent = time.monotonic()
        finally:
            # Whether the transfer completed or failed, the agent is done with them.
            self.allocator.free(blocks)
        # transfer_ms: from the end of the computation until the blocks had landed;
        # with layer_by_layer only what did not overlap the computation.
        return {"first_token": first_token, "queue_ms": _ms(started - arrived),
                "prefill_ms": _ms(computed - started), "transfer_ms": _ms(sent - computed)}

    def prefill_held(self, body):
        """/prefill into blocks the caller allocated, which it moves and frees."""
        config = self.model.config
        _str(body, "request_id")
        tokens = _ints(body, "tokens", 0, config.vocab - 1)
        blocks = _ints(body, "block_ids", 0, self.allocator.num_blocks - 1)
        self.allocator.check_held(blocks)
        if len(blocks) != config.blocks_for(len(tokens)):
            raise BadRequest(f"{len(tokens)} tokens take {config.blocks_for(len(tokens))} "
                             f"blocks, not {len(blocks)}")
        on_layer = None
        if "transfer_id" in body:
            transfer_id = _str(body, "transfer_id")
            cuda = self.model.device.type == "cuda"

            def on_layer(layer):
                if cuda:  # the agent reads the layer straight from the GPU
                    torch.cuda.synchronize(self.model.device)
                self.send.layers_ready(transfer_id, layer + 1)

        arrived = time.monotonic()
        with self._compute:
            started = time.monotonic()
            first_token = int(self.model.prefill(tokens, blocks, on_layer=on_layer).argmax())
            if self.model.device.type == "cuda":
                torch.cuda.synchronize(self.model.device)  # complete before it moves
            computed = time.monotonic()
        return {"first_token": first_token, "queue_ms": _ms(started - arrived),
                "prefill_ms": _ms(computed - started)}

    def routes(self):
        return {"/prefill": self.prefill, "/allocate": self.allocate, "/free": self.free}


class DecodeEngine:
    """Hands out blocks for prompts to land in, waits for them, decodes greedily."""

    def __init__(self, model, allocator, arrivals, node, tensor, wait_s):
        self.model = model
        self.allocator = allocator
        self.arrivals = arrivals
        self.node = node
        self.tensor = tensor
        self.wait_s = wait_s

    def allocate(self, body):
        n_tokens = _int(body, "n_tokens", 1)
        max_new = _int(body, "max_new", 1)
        ids = self.allocator.allocate(self.model.config.blocks_for(
            positions_needed(n_tokens, max_new)))
        self.arrivals.forget(ids)
        return {"block_ids": ids, "node": self.node, "tensor": self.tensor}

    def generate(self, body):
        config = self.model.config
        _str(body, "request_id")
        prompt_len = _int(body, "prompt_len", 1)
        first_token = _int(body, "first_token", 0, config.vocab - 1)
        block_ids = _ints(body, "block_ids", 0, self.allocator.num_blocks - 1)
        max_new = _int(body, "max_new", 1)
        self.allocator.check_held(block_ids)
        try:
            needed = config.blocks_for(positions_needed(prompt_len, max_new))
            if len(block_ids) < needed:
                raise BadRequest(f"{prompt_len} + {max_new} tokens need {needed} blocks")
            started = time.monotonic()
            self.arrivals.wait(block_ids[:config.blocks_for(prompt_len)], self.wait_s)
            landed = time.monotonic()
            tokens = greedy_decode(self.model, first_token, prompt_len, block_ids, max_new)
            done = time.monotonic()
        finally:
            self.allocator.free(block_ids)
        return {"tokens": tokens, "wait_ms": _ms(landed - started),
                "decode_ms": _ms(done - landed)}

    def free(self, body):
        self.allocator.free(_ints(body, "block_ids", 0, self.allocator.num_blocks - 1))
        return {}

    def routes(self):
        return {"/allocate": self.allocate, "/generate": self.generate, "/free": self.free}


# Exceptions a route raises, by the HTTP status they answer.
_STATUS = ((BadRequest, 400), (OutOfBlocks, 503), (TransferFailed, 502), (TimeoutError, 504))


def make_server(routes, info, port=0):
    """A ThreadingHTTPServer on 127.0.0.1:`port` (0: the kernel picks) serving the
    POST `routes` ({path: fn(body dict) -> reply dict}) and GET /info (`info()`). Each
    request runs on a thread of its own."""

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status, reply):
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/info":
                self._reply(200, info())
            else:
                self._reply(404, {"error": f"no GET {self.path}"})

        def do_POST(self):
            route = routes.get(self.path)
            if route is None:
                self._reply(404, {"error": f"no POST {self.path}"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY_BYTES:
                self._reply(413 if length else 400, {"error": f"a body of {length} bytes"})
                return
            try:
                body = json.loads(self.rfile.read(length))
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
                reply, status = route(body), 200
            except json.JSONDecodeError as e:
                reply, status = {"error": f"not JSON: {e}"}, 400
            except Exception as e:  # noqa: BLE001 (every failure answers the client)
                status = next((s for kind, s in _STATUS if isinstance(e, kind)), 500)
                reply = {"error": str(e)}
                if status == 500:
                    traceback.print_exc()
                print(f"{self.path}: {status} {e}", file=sys.stderr, flush=True)
            self._reply(status, reply)

        def log_message(self, *args):  # one line per failure above is enough
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    return server


def reference_generate(config, prompts, max_new, device="cpu"):
    """The proof's baseline: every prompt run by one engine, prefill then greedy
    decode steps through the same code as the two engines, on the same `device`
    (setup_device's names), into its own cache at blocks 0, 1, ... . Returns one
    token list per prompt."""
    device = setup_device(device)
    longest = max(positions_needed(len(p), max_new) for p in prompts)
    num_blocks = config.blocks_for(longest)
    if device.type == "cuda":
        buffers = [torch.zeros(config.layer_shape(num_blocks), dtype=torch.float32,
                               device=device) for _ in range(config.layers)]
    else:
        buffers = [bytearray(config.layer_bytes(num_blocks)) for _ in range(config.layers)]
    cache = PagedKvCache(config, num_blocks, buffers)
    model = make_model(config, cache)
    table = list(range(num_blocks))
    out = []
    for prompt in prompts:
        first = int(model.prefill(prompt, table).argmax())
        out.append(greedy_decode(model, first, len(prompt), table, max_new))
    return out


def _lend(args, config, role, device):
    """The cache in HostBuffers (CPU) or CUDA tensors, one per layer, registered with
    this node's agent. Returns (cache, engine agent, router agent or None, watch or
    None); the agent client and the cache's views keep the buffers alive."""
    import fuselink

    if device.type == "cuda":
        # One allocation per layer, as vLLM keeps them, each lent by CUDA IPC.
        buffers = [torch.zeros(config.layer_shape(args.blocks), dtype=torch.float32,
                               device=device) for _ in range(config.layers)]
        cache = PagedKvCache(config, args.blocks, buffers)
    else:
        buffers = [fuselink.HostBuffer(config.layer_bytes(args.blocks),
                                       f"disagg-{role}-{layer}")
                   for layer in range(config.layers)]
        cache = PagedKvCache(config, args.blocks, [b.data for b in buffers])
    tls = lambda kind, name: fuselink.Tls.from_dir(args.tls_dir, kind, name)  # noqa: E731
    engine_agent = fuselink.Agent(args.agent, handle_socket=args.handle_socket,
                                  tls=tls("engine", args.engine_name))
    router_agent = watch = None
    if role == "prefill":
        # The prefill engine lends its cache as an engine and asks for the transfer
        # as a router: it alone knows which blocks hold the prompt and when they are
        # complete, and frees them when the transfer ends, so no third process has to
        # relay either. Only that router identity may read the cache; nobody writes.
        router_agent = fuselink.Agent(args.agent, tls=tls("router", args.router_name))
        reader = f"spiffe://fuselink/router/{args.router_name}"
        engine_agent.register_kv_layers(args.tensor, buffers, args.blocks, owner_pidfd=True,
                                        watch=False, readers=[reader])
    else:
        # Only the named writers (the prefill engine's router identity) may land
        # blocks here, and nobody may read them out.
        engine_agent.register_kv_layers(args.tensor, buffers, args.blocks, owner_pidfd=True,
                                        watch=False, writers=args.writers.split(","))
        # What /generate waits on, in place before the engine says it is ready. Opened
        # here on a tensor we own, not by watch=True: that first tries a watch before
        # registering, which the agent refuses an engine, and gRPC's Python client can
        # hear of the refusal only after the Watch has returned (the initial metadata
        # and the status come as two events), leaving a watch that is already dead.
        watch = engine_agent.watch(args.tensor)
    return cache, engine_agent, router_agent, watch


def _write_ready(path, info):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        # No spaces, as agents write theirs: scripts/lib/agents.sh's field() reads both.
        json.dump(info, f, separators=(",", ":"))
    os.replace(tmp, path)  # whoever polls for it never reads half a file


def _serve(args):
    config = PRESETS[args.model]
    device = setup_device(args.device)
    # The caches first, in a fresh allocator: nothing freed yet to carve them from.
    cache, engine_agent, router_agent, watch = _lend(args, config, args.role, device)
    node = engine_agent.node
    model = make_model(config, cache)
    allocator = BlockAllocator(args.blocks)
    if args.role == "prefill":
        engine = PrefillEngine(model, allocator,
                               AgentSender(router_agent, args.tensor, args.wait_s),
                               layer_by_layer=args.layer_by_layer, node=node,
                               tensor=args.tensor)
    else:
        arrivals = Arrivals()
        threading.Thread(target=follow_watch, args=(watch, arrivals), name="watch",
                         daemon=True).start()
        engine = DecodeEngine(model, allocator, arrivals, node, args.tensor, args.wait_s)

    def info():
        return {"role": args.role, "config": dataclasses.asdict(config), "node": node,
                "device": str(device), "tensor": args.tensor, "blocks": args.blocks,
                "free_blocks": allocator.free_count()}

    server = make_server(engine.routes(), info, args.port)
    signal.signal(signal.SIGTERM,
                  lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    _write_ready(args.ready_file, {**info(), "url": f"http://127.0.0.1:{server.server_port}"})
    try:
        server.serve_forever()
    finally:
        server.server_close()
        if watch is not None:
            watch.close()
        try:
            engine_agent.unregister(args.tensor)
        except Exception as e:  # noqa: BLE001 (the agent may be gone; it drops it then)
            print(f"unregistering {args.tensor}: {e}", file=sys.stderr)
        engine_agent.close()
        if router_agent is not None:
            router_agent.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", action="store_true",
                   help="read prompts as JSON on stdin, print the single-engine tokens")
    p.add_argument("--role", choices=("prefill", "decode"))
    p.add_argument("--port", type=int, default=0, help="HTTP port on 127.0.0.1; 0: any")
    p.add_argument("--ready_file", help="written with {url, node, tensor, ...} once serving")
    p.add_argument("--device", default="cpu",
                   help="cpu, or cuda[:index]: the model, its compute and the cache")
    p.add_argument("--model", choices=sorted(PRESETS), default="tiny",
                   help="model.PRESETS: tiny (the example's own) or llama (transformers)")
    p.add_argument("--blocks", type=int,
                   help=f"cache blocks (default: {DEFAULT_BLOCKS})")
    p.add_argument("--agent", help="this node's agent, host:port")
    p.add_argument("--handle_socket", help="the agent's handle socket")
    p.add_argument("--tls_dir", help="scripts/certs.sh's folder")
    p.add_argument("--engine_name", help="lends as engine/NAME (default: the role)")
    p.add_argument("--router_name", default="prefill",
                   help="prefill: asks transfers as router/NAME")
    p.add_argument("--writers", default="role:router",
                   help="decode: who may land blocks, comma-separated")
    p.add_argument("--tensor", help="the cache's name at the agent (default: kv-ROLE)")
    p.add_argument("--layer_by_layer", action="store_true",
                   help="prefill: send each layer's K/V as soon as it is computed")
    p.add_argument("--wait_s", type=float, default=30,
                   help="bound on a transfer, and on waiting for one to land")
    args = p.parse_args()
    if args.reference:
        request = json.load(sys.stdin)
        json.dump({"tokens": reference_generate(PRESETS[args.model], request["prompts"],
                                                request["max_new"], args.device)},
                  sys.stdout)
        print()
        return
    missing = [f"--{n}" for n in ("role", "agent", "handle_socket", "tls_dir", "ready_file")
               if getattr(args, n) is None]
    if missing:
        p.error(f"serving needs {' '.join(missing)}")
    if args.blocks is None:
        args.blocks = DEFAULT_BLOCKS
    args.engine_name = args.engine_name or args.role
    args.tensor = args.tensor or f"kv-{args.role}"
    _serve(args)


if __name__ == "__main__":
    main()
