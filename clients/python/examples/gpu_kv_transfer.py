#!/usr/bin/env python3
"""Moves a KV cache from one GPU to another through two fuselink agents and checks it.

Fills a KV cache on --source_gpu with a seeded pattern, lends it to the source agent,
lends a zeroed one on --target_gpu to the target agent, asks the source agent to move
every block, waits on the target agent until the transfer has landed, and compares
checksums that both GPUs compute over their own copy. Prints one JSON line; exits 1
when the checksums differ, 2 when an agent refuses.

CUDA IPC handles are valid only on the node that made them, so each agent must run on
the node whose GPU it is lent, with this process's GPU numbering (the same
CUDA_VISIBLE_DEVICES). --role both (the default) runs both ends in this process: two
agents of one machine. For two machines, run --role target on the target node first
and --role source on the source node once the target prints its ready line; the
target rebuilds the source's pattern from --seed to know the expected checksum.

The agents serve mutual TLS: --tls_dir is the folder scripts/certs.sh wrote the CA
and client certificates to. The KV caches are lent as the engine --engine (its
certificate engine-<name>), the transfer is asked for as the router --router
(router-<name>), as the default access policy has it. --plaintext instead talks to
agents started with --plaintext.

    scripts/certs.sh certs engine e1; scripts/certs.sh certs router r1
    python3 gpu_kv_transfer.py --tls_dir=certs --source_agent=127.0.0.1:50051 \\
        --source_socket=/run/fuselink/node-a.sock --target_agent=127.0.0.1:50052 \\
        --target_socket=/run/fuselink/node-b.sock --source_gpu=0 --target_gpu=1
"""

import argparse
import json
import sys
import time

import torch

import fuselink

NAME = "gpu-kv-example"


def to_int64(value):
    """An unsigned 64-bit constant as the int64 torch multiplies with (wrapping)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def mix(z):
    """splitmix64's finalizer on int64 words (arithmetic shifts): deterministic on any
    GPU, unlike torch's random generators, whose output depends on the launch shape."""
    z = (z ^ (z >> 30)) * to_int64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> 27)) * to_int64(0x94D049BB133111EB)
    return z ^ (z >> 31)


def pattern(size_bytes, seed, device):
    words = torch.arange(size_bytes // 8, dtype=torch.int64, device=device)
    return mix(words * to_int64(0x9E3779B97F4A7C15) + seed).view(torch.uint8)


def checksum(tensor):
    """A position-sensitive sum, computed on the tensor's own GPU (wraps mod 2^64)."""
    words = tensor.view(torch.int64)
    index = torch.arange(words.numel(), dtype=torch.int64, device=tensor.device)
    return int(mix(words ^ index).sum().item()) & ((1 << 64) - 1)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=["both", "source", "target"], default="both")
    p.add_argument("--source_agent", default="127.0.0.1:50051")
    p.add_argument("--source_socket", help="default: the source agent's default")
    p.add_argument("--target_agent", default="127.0.0.1:50052")
    p.add_argument("--target_socket", help="default: the target agent's default")
    p.add_argument("--target_node", help="default: asked of --target_agent")
    p.add_argument("--source_gpu", type=int, default=0)
    p.add_argument("--target_gpu", type=int, default=1)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--blocks", type=int, default=64, help="blocks per layer")
    p.add_argument("--block_bytes", type=int, default=256 << 10)
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--timeout_s", type=float, default=120)
    p.add_argument("--tls_dir", help="scripts/certs.sh's folder: ca.crt and the "
                   "certificates of --engine and --router")
    p.add_argument("--engine", default="e1", help="engine certificate name")
    p.add_argument("--router", default="r1", help="router certificate name")
    p.add_argument("--tls_server_name",
                   help="name the agents' certificates must carry; default: the host")
    p.add_argument("--plaintext", action="store_true",
                   help="agents started with --plaintext: no TLS")
    args = p.parse_args()
    if args.block_bytes % 8:
        p.error("--block_bytes must be a multiple of 8")
    if bool(args.tls_dir) == args.plaintext:
        p.error("give --tls_dir (the agents serve mutual TLS) or --plaintext")
    return args


def connect(args, address, kind, handle_socket=None):
    """An Agent at `address` speaking as the `kind` ("engine" or "router") named on
    the command line."""
    if args.plaintext:
        return fuselink.Agent(address, handle_socket=handle_socket, plaintext=True)
    tls = fuselink.Tls.from_dir(args.tls_dir, kind, getattr(args, kind),
                                server_name=args.tls_server_name)
    return fuselink.Agent(address, handle_socket=handle_socket, tls=tls)


def run(args):
    size_bytes = args.layers * args.blocks * args.block_bytes
    out = {"role": args.role, "bytes": size_bytes}

    if args.role in ("both", "target"):
        target = connect(args, args.target_agent, "engine", args.target_socket)
        kv_target = torch.zeros(size_bytes, dtype=torch.uint8,
                                device=f"cuda:{args.target_gpu}")
        target.register_kv_cache(NAME, kv_target, args.layers, args.blocks)
        if args.role == "target":
            print(json.dumps({"ready": True, "node": target.node, "tensor": NAME}),
                  flush=True)

    if args.role in ("both", "source"):
        source = connect(args, args.source_agent, "engine", args.source_socket)
        router = connect(args, args.source_agent, "router")
        kv_source = pattern(size_bytes, args.seed, f"cuda:{args.source_gpu}")
        torch.cuda.synchronize(args.source_gpu)  # the agent reads what the GPU wrote
        source.register_kv_cache(NAME, kv_source, args.layers, args.blocks)
        target_node = args.target_node or (
            target.node if args.role == "both" else
            connect(args, args.target_agent, "router").node)
        start = time.perf_counter()
        final = router.transfer(NAME, target_node, NAME, timeout=args.timeout_s)
        out["agent_seconds"] = final.completed.seconds
        out["per_nic"] = {n.nic: n.bytes for n in final.completed.per_nic}

    if args.role in ("both", "target"):
        landed = target.wait_for_transfer(NAME, timeout=args.timeout_s)
        out["bytes"] = landed.bytes

    if args.role in ("both", "source"):
        seconds = time.perf_counter() - start
        out["seconds"] = round(seconds, 6)
        out["gbytes_per_s"] = round(size_bytes / seconds / 1e9, 3)

    if args.role in ("both", "target"):
        got = checksum(kv_target)
        want = (checksum(kv_source) if args.role == "both" else
                checksum(pattern(size_bytes, args.seed, kv_target.device)))
        out.update(source_checksum=f"{want:016x}", target_checksum=f"{got:016x}",
                   match=got == want)
        target.unregister(NAME)
    if args.role in ("both", "source"):
        source.unregister(NAME)
    return out


def main():
    args = parse_args()
    try:
        out = run(args)
    except fuselink.FuselinkError as e:
        print(json.dumps({"error": e.message, "code": e.code.name, "reason": e.reason}))
        return 2
    print(json.dumps(out))
    return 0 if out.get("match", True) else 1


if __name__ == "__main__":
    sys.exit(main())
