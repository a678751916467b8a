#!/usr/bin/env python3
"""Two ranks on one GPU talking through NCCL's net layer, as PyTorch users run it.

    python3 tests/nccl/torch_bench.py --out results.json [--label NAME] [--max-bytes 1GiB]
        [--min-bytes 1KiB] [--ops send_recv,all_reduce,all_gather,broadcast]

Spawns two worker processes (no torchrun) with RANK / WORLD_SIZE / MASTER_ADDR=127.0.0.1
and a different NCCL_HOSTID each, so NCCL takes them for two hosts and carries every
byte through its net plugin (NCCL_NET=grdma with NCCL_NET_PLUGIN=..., or NCCL_NET=Socket
for the reference): NCCL_SOCKET_IFNAME=lo, NCCL_NVLS_ENABLE=0. Both ranks use cuda:0.

For each size from --min-bytes (1 KiB) to --max-bytes (x4 steps): send/recv (rank 0 to
rank 1), all_reduce (int32 sum), all_gather and broadcast (--ops picks a subset). Each op runs once checked bit-exact
on the GPU (torch.equal against the expected tensor, computed on the GPU), then timed
over several iterations and checked again. GB/s is the payload per rank per second
(send/recv: the message; all_reduce, broadcast: the tensor; all_gather: the output),
the slower rank's time. One JSON document goes to --out; the exit status is 1 if any
check failed. Other NCCL_* variables pass through to the workers unchanged.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time


def parse_size(s):
    s = s.strip()
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "B": 1}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


def sizes_up_to(max_bytes, min_bytes=1 << 10):
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= 4
    return out


def iterations(nbytes):
    # About 256 MiB per timing, 3 to 20 runs: the whole sweep stays within minutes.
    return max(3, min(20, (256 << 20) // nbytes))


def nccl_version(torch):
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def worker(args):
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)

    def pattern(n, seed):
        # A different int32 value at every index and for every seed, made on the GPU.
        i = torch.arange(n, dtype=torch.int64, device=dev)
        return ((i * 2654435761 + seed * 40503 + 7) % (1 << 31)).to(torch.int32)

    def timed(fn, iters):
        fn()  # warm-up
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        # The slower rank's time.
        t = torch.tensor([dt], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item() / iters

    def all_ok(flag):
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item())

    results = []

    def send_recv(nbytes, n, iters):
        # rank 0 -> rank 1
        src = pattern(n, 1)
        dst = torch.zeros(n, dtype=torch.int32, device=dev)

        def sendrecv():
            if rank == 0:
                dist.send(src, dst=1)
            else:
                dist.recv(dst, src=0)

        sendrecv()
        ok1 = rank == 0 or torch.equal(dst, src)
        dst.zero_()
        t = timed(sendrecv, iters)
        ok2 = rank == 0 or torch.equal(dst, src)
        results.append(("send_recv", nbytes, nbytes / t / 1e9, all_ok(ok1 and ok2), iters))
        del src, dst

    def all_reduce(nbytes, n, iters):
        # all_reduce (int32 sum: exact)
        mine = pattern(n, 10 + rank)
        expect = pattern(n, 10) + pattern(n, 11)
        x = mine.clone()
        dist.all_reduce(x)
        ok1 = torch.equal(x, expect)
        scratch = mine.clone()
        t = timed(lambda: dist.all_reduce(scratch), iters)
        x = mine.clone()
        dist.all_reduce(x)
        ok2 = torch.equal(x, expect)
        results.append(("all_reduce", nbytes, nbytes / t / 1e9, all_ok(ok1 and ok2), iters))
        del mine, expect, x, scratch

    def all_gather(nbytes, n, iters):
        # all_gather (into one tensor)
        mine = pattern(n, 20 + rank)
        expect = torch.cat([pattern(n, 20), pattern(n, 21)])
        out = torch.zeros(2 * n, dtype=torch.int32, device=dev)
        dist.all_gather_into_tensor(out, mine)
        ok1 = torch.equal(out, expect)
        out.zero_()
        t = timed(lambda: dist.all_gather_into_tensor(out, mine), iters)
        ok2 = torch.equal(out, expect)
        results.append(("all_gather", nbytes, 2 * nbytes / t / 1e9, all_ok(ok1 and ok2), iters))
        del mine, expect, out

    def broadcast(nbytes, n, iters):
        # broadcast from rank 0
        expect = pattern(n, 30)
        x = expect.clone() if rank == 0 else torch.zeros(n, dtype=torch.int32, device=dev)
        dist.broadcast(x, src=0)
        ok1 = torch.equal(x, expect)
        t = timed(lambda: dist.broadcast(x, src=0), iters)
        ok2 = torch.equal(x, expect)
        results.append(("broadcast", nbytes, nbytes / t / 1e9, all_ok(ok1 and ok2), iters))
        del expect, x

    ops = set(args.ops.split(","))
    for nbytes in sizes_up_to(args.max_bytes, args.min_bytes):
        n = nbytes // 4
        iters = iterations(nbytes)

        if "send_recv" in ops:
            send_recv(nbytes, n, iters)
        if "all_reduce" in ops:
            all_reduce(nbytes, n, iters)
        if "all_gather" in ops:
            all_gather(nbytes, n, iters)
        if "broadcast" in ops:
            broadcast(nbytes, n, iters)
        torch.cuda.empty_cache()

    if rank == 0:
        doc = {
            "label": args.label,
            "net": os.environ.get("NCCL_NET", ""),
            "plugin": os.environ.get("NCCL_NET_PLUGIN", ""),
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
            "torch": torch.__version__,
            "nccl": nccl_version(torch),
            "gpu": torch.cuda.get_device_name(0),
            "results": [
                {"op": op, "bytes": b, "GBps": round(g, 4), "exact": ok, "iters": it}
                for (op, b, g, ok, it) in results
            ],
        }
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        bad = [r for r in doc["results"] if not r["exact"]]
        for r in doc["results"]:
            print(f"{args.label:>16} {r['op']:>10} {r['bytes']:>11} B {r['GBps']:8.3f} GB/s"
                  f" {'exact' if r['exact'] else 'MISMATCH'}", flush=True)
        if bad:
            print(f"torch_bench: {len(bad)} results not bit-exact", file=sys.stderr)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON results file")
    ap.add_argument("--label", default=os.environ.get("NCCL_NET", "default"))
    ap.add_argument("--max-bytes", default="1GiB", type=parse_size)
    ap.add_argument("--min-bytes", default="1KiB", type=parse_size)
    ap.add_argument("--ops", default="send_recv,all_reduce,all_gather,broadcast",
                    help="comma-separated subset of the ops")
    ap.add_argument("--timeout", default=1800, type=int, help="seconds for the whole run")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    port = str(free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            # Two "hosts" on one machine: NCCL carries everything over its net layer.
            NCCL_HOSTID=f"grdma-bench-host-{rank}",
            NCCL_SOCKET_IFNAME=env.get("NCCL_SOCKET_IFNAME", "lo"),
            NCCL_NVLS_ENABLE="0",
        )
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--out", args.out,
               "--label", args.label, "--max-bytes", str(args.max_bytes),
               "--min-bytes", str(args.min_bytes), "--ops", args.ops]
        procs.append(subprocess.Popen(cmd, env=env))
    deadline = time.time() + args.timeout
    codes = [None, None]
    while any(c is None for c in codes):
        for i, p in enumerate(procs):
            if codes[i] is None:
                codes[i] = p.poll()
        if any(c not in (None, 0) for c in codes) or time.time() > deadline:
            # One rank failed or the run hung: stop the other (by its pid).
            for i, p in enumerate(procs):
                if codes[i] is None:
                    p.kill()
                    codes[i] = p.wait()
            break
        time.sleep(0.2)
    if time.time() > deadline:
        print(f"torch_bench: not done in {args.timeout} s", file=sys.stderr)
        return 1
    if any(codes):
        print(f"torch_bench: worker exit codes {codes}", file=sys.stderr)
        return 1
    with open(args.out) as f:
        doc = json.load(f)
    return 0 if all(r["exact"] for r in doc["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
