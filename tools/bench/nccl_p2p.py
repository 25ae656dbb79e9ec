#!/usr/bin/env python3
"""NCCL point-to-point baseline: one GPU sends a buffer to a GPU on another node.

The incumbent fuselink is compared with: what a serving stack that moves a KV cache
with NCCL send/recv gets over the same rails. Two ranks, each started on its own
(scripts/bench-*.sh starts rank 0 in one node's network namespace and rank 1 in the
other's): rank 0 sends --bytes from its --gpu to rank 1's --gpu, first one round that
rank 1 checks byte for byte, then --warmup untimed rounds, then --iters timed rounds.
Rank 1 times them (after a barrier, between two torch.cuda.synchronize calls) and
prints one JSON line:

  {"bytes": ..., "iters": ..., "seconds": ..., "gbytes_per_s": ..., "nccl_version": ...}

gbytes_per_s is bytes * iters / seconds / 1e9. It exits 1 if the bytes are wrong.

Rendezvous (torch.distributed, TCP store on rank 0): MASTER_ADDR, MASTER_PORT, RANK
and WORLD_SIZE (must be 2) from the environment, or --master_addr, --master_port,
--rank.

NCCL reads its settings from the environment; this script sets none of them. For a
comparison with fuselink's TCP transport over emulated rails the caller sets:
  NCCL_SOCKET_IFNAME=rail0,rail1,...  the interfaces NCCL may use (prefixes; a
                                      leading '=' makes them exact names)
  NCCL_IB_DISABLE=1                   sockets, not verbs
  NCCL_NET=Socket                     optional: insist on the socket transport
  NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1
                                      with both ranks on one host, keeps NCCL off
                                      NVLink/PCIe copies and shared memory, so the
                                      bytes cross the rails as between two nodes
  NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD
                                      NCCL's socket parallelism; report them with
                                      the numbers
  NCCL_DEBUG=INFO                     shows which interfaces NCCL chose
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def parse_args():
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--master_addr", default=env("MASTER_ADDR", "127.0.0.1"))
    p.add_argument("--master_port", type=int, default=int(env("MASTER_PORT", "29500")))
    p.add_argument("--rank", type=int, default=int(env("RANK", "-1")))
    p.add_argument("--gpu", type=int, default=0, help="CUDA device of this rank")
    p.add_argument("--bytes", type=int, default=256 << 20, help="bytes per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    if args.rank not in (0, 1):
        p.error("give --rank (or RANK) 0 for the sender, 1 for the receiver")
    if int(env("WORLD_SIZE", "2")) != 2:
        p.error("WORLD_SIZE must be 2: one sender, one receiver")
    if args.bytes <= 0 or args.iters <= 0 or args.warmup < 0:
        p.error("--bytes and --iters must be positive, --warmup not negative")
    return args


def pattern(size_bytes, device):
    """Bytes that differ at every position (words of a multiplicative hash of the
    index), made the same way on both ranks so the receiver knows what to expect."""
    words = torch.arange((size_bytes + 7) // 8, dtype=torch.int64, device=device)
    words = words * -7046029254386353131 + 0x5DEECE66D  # 0x9E3779B97F4A7C15 as int64
    return words.view(torch.uint8)[:size_bytes]


def one_round(args, buffer):
    """One round: rank 0 sends the buffer, rank 1 receives into it."""
    if args.rank == 0:
        dist.send(buffer, dst=1)
    else:
        dist.recv(buffer, src=0)


def main():
    args = parse_args()
    torch.cuda.set_device(args.gpu)
    device = torch.device("cuda", args.gpu)
    dist.init_process_group("nccl", init_method=f"tcp://{args.master_addr}:{args.master_port}",
                            rank=args.rank, world_size=2)
    if args.rank == 0:
        buffer = pattern(args.bytes, device).contiguous()
    else:
        buffer = torch.zeros(args.bytes, dtype=torch.uint8, device=device)

    one_round(args, buffer)
    torch.cuda.synchronize()
    verified = args.rank == 0 or torch.equal(buffer, pattern(args.bytes, device))

    for _ in range(args.warmup):
        one_round(args, buffer)
    dist.barrier(device_ids=[args.gpu])
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.iters):
        one_round(args, buffer)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    dist.destroy_process_group()

    if args.rank == 1:
        if not verified:
            print("nccl_p2p: the first round's bytes differ from what rank 0 sent",
                  file=sys.stderr)
            return 1
        print(json.dumps({
            "bytes": args.bytes,
            "iters": args.iters,
            "seconds": round(seconds, 6),
            "gbytes_per_s": round(args.bytes * args.iters / seconds / 1e9, 3),
            "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
