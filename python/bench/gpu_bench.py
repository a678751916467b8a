#!/usr/bin/env python3
"""GPU to GPU through gpu_rdma, two processes over loopback TCP, as a user runs it.

    python3 python/bench/gpu_bench.py [--size 1GiB] [--streams 1,4,8] [--iters 5] > out.json

The receiver (a child process) allocates one CUDA tensor and receives each transfer
into it in place (`recv_into`); the sender sends a CUDA tensor (`send`), each transfer
checked by CRC32C per chunk (the checksum kernel on each GPU). The receiver checks the
last transfer with torch.equal on the GPU. GB/s (1e9 bytes/s) is the sender's time from
`send` to the receiver's verified ack, median over --iters. One JSON document to stdout.
"""

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import time

import torch

import gpu_rdma

RECEIVER = textwrap.dedent(
    r"""
    import json, sys, torch, gpu_rdma
    n, iters, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    target = torch.empty(n, dtype=torch.uint8, device="cuda")
    listener = gpu_rdma.listen("127.0.0.1:0", timeout=60, wait=120, max_bytes=n)
    print(listener.port, flush=True)
    for _ in range(iters):
        listener.recv_into(target)
    g = torch.Generator(device="cuda"); g.manual_seed(seed)
    expected = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=g)
    print(json.dumps({"equal": bool(torch.equal(target, expected))}), flush=True)
    """
)


def parse_size(s):
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if s.endswith(unit):
            return int(float(s[: -len(unit)]) * m)
    return int(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--streams", default="1,4,8")
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    n = parse_size(args.size)
    seed = 1234
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    data = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=g)
    torch.cuda.synchronize()
    out = {"what": "gpu_rdma send -> recv_into, CUDA tensor to CUDA tensor, two processes, TCP loopback",
           "bytes": n, "unit": "GB/s = 1e9 bytes/s", "runs": {}}
    ok = True
    for streams in [int(s) for s in args.streams.split(",")]:
        child = subprocess.Popen([sys.executable, "-c", RECEIVER, str(n), str(args.iters), str(seed)],
                                 stdout=subprocess.PIPE, text=True)
        try:
            port = int(child.stdout.readline())
            ep = gpu_rdma.connect(f"127.0.0.1:{port}", streams=streams, timeout=60)
            rates, kept, phases = [], [], []
            for _ in range(args.iters):
                t0 = time.perf_counter()
                report = ep.send(data)
                wall = time.perf_counter() - t0
                rates.append(n / wall / 1e9)
                kept.append(report["kept_connection"])
                # Where the wall time went: the engine's connect (0 on a kept connection),
                # its data time (first chunk to last written) and round trip (to the ack).
                phases.append({"wall_s": round(wall, 4),
                               "connect_s": round(report.get("connect_seconds") or 0.0, 4),
                               "data_s": round(report.get("seconds") or 0.0, 4),
                               "round_trip_s": round(report.get("round_trip_seconds") or 0.0, 4)})
                assert report["receiver"]["status"] == "verified"
            rest, _ = child.communicate(timeout=120)
            equal = json.loads(rest.strip().splitlines()[-1])["equal"]
        finally:
            if child.poll() is None:
                child.kill()
        ok &= equal
        out["runs"][str(streams)] = {"gb_per_s": [round(r, 3) for r in rates],
                                     "median": round(statistics.median(rates), 3),
                                     "kept_connection": kept,
                                     "phases": phases,
                                     "exact": equal}
    print(json.dumps(out, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
