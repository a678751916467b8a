#!/usr/bin/env python3
"""Mooncake's Transfer Engine (protocol "tcp") moving a CUDA tensor between two processes on loopback.

    python3 python/bench/peers/mooncake_bench.py [--size 1GiB] [--iters 5] [--memory cuda|cpu] \
        [--io-threads N] > mooncake.json

Both processes start a TransferEngine with initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""):
the P2P handshake mode needs no metadata server (each engine serves its own segment
description on its RPC port, and a peer is named "host:rpc_port"). The receiver
allocates one tensor (cuda:0, or host memory with --memory cpu), registers it and gives
its session name and address to the sender over a pipe. The sender registers its tensor
(random bytes from a fixed seed) and calls transfer_sync_write of the whole tensor into
the receiver's, per iteration. That call returns when the sender's side is done (for TCP,
its last write to the socket), which can be a little before the receiver's engine has put
the last bytes in place; so the receiver checks the tensor against the expected bytes with
torch.equal on the GPU until they all match (at most --settle seconds), then zeroes it for
the next iteration. GB/s (1e9 bytes/s) is timed from the call to the receiver finding
every byte in place (its reply, less the duration of that successful check), median over
--iters; the time to the call's return is reported too. One untimed warm-up transfer
first (it makes the connection). Mooncake's TCP transport reads and writes CUDA memory by copying
through host buffers itself (cudaMemcpy); the bench never copies to the host.
--io-threads sets MC_NUM_TCP_IO_THREADS (the engine's TCP I/O pool; default 1 in 0.3.14).
One JSON document to stdout.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import (Buffers, LineChild, Parent, cuda_lib_env, die, log, parse_size,  # noqa: E402
                         summarize, watchdog)

PEER = "mooncake"


def make_engine():
    from mooncake.engine import TransferEngine
    import mooncake.engine as me
    try:
        from importlib.metadata import version
        ver = version("mooncake-transfer-engine-cuda13")
    except Exception:
        ver = "unknown"
    eng = TransferEngine()
    rc = eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise RuntimeError(f"TransferEngine.initialize(127.0.0.1, P2PHANDSHAKE, tcp) returned {rc}")
    return eng, ver, bool(getattr(me, "SUPPORT_CUDA", False))


def register(eng, bufs, t, n):
    loc = "cuda:0" if bufs.memory == "cuda" else "cpu:0"
    rc = eng.register_memory(bufs.ptr(t), n, loc)
    if rc != 0:
        raise RuntimeError(f"register_memory({n} bytes, {loc}) returned {rc}")


def receiver(args):
    par = Parent()
    try:
        bufs = Buffers(args.memory)
        n = args.n
        target = bufs.zeros(n)
        expected = bufs.data(n)
        eng, _, _ = make_engine()
        register(eng, bufs, target, n)
        par.send({"session": f"127.0.0.1:{eng.get_rpc_port()}", "addr": bufs.ptr(target)})
    except Exception as e:
        par.send({"error": f"receiver setup: {type(e).__name__}: {e}"})
        raise
    while True:
        msg = par.recv()
        if "check" not in msg:
            break
        # transfer_sync_write returns when the sender's side is done (for TCP: its last
        # write to the socket), which can be before the receiver's engine has put the last
        # bytes in place: check until every byte is there, for at most --settle seconds.
        t_first = time.monotonic()
        tries = 0
        while True:
            t_check = time.monotonic()
            eq = bufs.equal(target, expected)
            tries += 1
            if eq or time.monotonic() - t_first > args.settle:
                break
            time.sleep(0.0005)
        check_s = time.monotonic() - t_check
        bufs.zero_(target)
        par.send({"checked": msg["check"], "equal": eq, "tries": tries, "check_s": check_s,
                  "settle_s": t_check - t_first})


def sender(args):
    n = args.n
    doc = {"peer": PEER, "version": None, "size": n, "memory": f"{args.memory}->{args.memory}",
           "iters": args.iters, "gb_per_s": [], "median": None, "exact": False}
    bufs = Buffers(args.memory)
    data = bufs.data(n)
    eng, ver, cuda_build = make_engine()
    doc["version"] = ver
    register(eng, bufs, data, n)
    child = LineChild([sys.executable, os.path.abspath(__file__), "--role", "recv", "--size", str(n),
                       "--iters", str(args.iters), "--memory", args.memory, "--wait", str(args.wait),
                       "--settle", str(args.settle)],
                      env=cuda_lib_env())
    try:
        info = child.recv(args.wait, "session name")
        rates, ret_rates, settle, exact, warm = [], [], [], True, None
        for i in range(args.iters + 1):
            t0 = time.perf_counter()
            rc = eng.transfer_sync_write(info["session"], bufs.ptr(data), info["addr"], n)
            t1 = time.perf_counter()
            if rc != 0:
                raise RuntimeError(f"transfer_sync_write {i} returned {rc}")
            child.send({"check": i})
            chk = child.recv(args.wait, f"check of transfer {i}")
            t_seen = time.perf_counter() - chk["check_s"]  # less the successful check itself
            exact &= bool(chk["equal"])
            if i == 0:
                warm = round(t_seen - t0, 4)
                continue
            rates.append(n / (t_seen - t0) / 1e9)
            ret_rates.append(n / (t1 - t0) / 1e9)
            settle.append({"tries": chk["tries"], "settle_s": round(chk["settle_s"], 4),
                           "check_s": round(chk["check_s"], 4)})
        child.send({"bye": True})
        doc["gb_per_s"], doc["median"] = summarize(rates)
        doc["gb_per_s_sync_write_return"], doc["median_sync_write_return"] = summarize(ret_rates)
        doc["receiver_checks"] = settle
        doc["exact"] = exact
        doc["warmup_s"] = warm
    finally:
        child.close()
    doc["device"] = bufs.device_name()
    doc["built_with_cuda"] = cuda_build
    doc["env"] = {k: v for k, v in os.environ.items() if k.startswith("MC_")}
    staging = ("Mooncake's TCP transport copies CUDA memory through host buffers itself (cudaMemcpy on both "
               "sides); the bench never copies to the host. " if args.memory == "cuda" else "")
    doc["notes"] = (f"{staging}TransferEngine protocol tcp, metadata P2PHANDSHAKE (no metadata server); one "
                    "transfer_sync_write of the whole buffer per iteration. gb_per_s is timed from the call to "
                    "the receiver finding every byte in place (its reply, less the duration of its successful "
                    "check): the call returns when the sender's side is done, which for TCP can be before the "
                    "receiver has copied the last bytes in (gb_per_s_sync_write_return: to the call's return; "
                    "receiver_checks: how many checks it took). Every iteration checked on the receiver "
                    f"({'torch.equal on the GPU' if args.memory == 'cuda' else 'numpy array_equal'}) and "
                    "zeroed before the next; first transfer (connection set-up) untimed. TCP I/O threads: "
                    f"{os.environ.get('MC_NUM_TCP_IO_THREADS', 'default (1)')}.")
    print(json.dumps(doc), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--memory", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--io-threads", type=int, default=0, help="MC_NUM_TCP_IO_THREADS (0: the engine's default)")
    ap.add_argument("--wait", type=float, default=120, help="seconds any one step may take")
    ap.add_argument("--settle", type=float, default=10,
                    help="seconds the receiver keeps checking for the last bytes after the sender's call returns")
    ap.add_argument("--timeout", type=float, default=240, help="seconds the whole run may take")
    ap.add_argument("--role", choices=["main", "send", "recv"], default="main", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.n = parse_size(args.size)
    if args.role == "recv":
        return receiver(args)
    if args.role == "send":
        try:
            return sender(args)
        except Exception as e:
            die(f"mooncake sender: {type(e).__name__}: {e}")
    # main: the watchdog
    if args.io_threads > 0:
        os.environ["MC_NUM_TCP_IO_THREADS"] = str(args.io_threads)
    os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
    os.environ.setdefault("GLOG_minloglevel", "1")
    argv = [sys.executable, os.path.abspath(__file__), "--role", "send"] + sys.argv[1:]
    sys.exit(watchdog(argv, args.timeout, {"peer": PEER, "size": args.n,
                                           "memory": f"{args.memory}->{args.memory}", "iters": args.iters,
                                           "gb_per_s": [], "median": None}))


if __name__ == "__main__":
    main()
