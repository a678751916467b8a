#!/usr/bin/env python3
"""NIXL (UCX backend, TCP transport) moving a CUDA tensor between two processes on loopback.

    python3 python/bench/peers/nixl_bench.py [--size 1GiB] [--iters 5] [--memory cuda|cpu] > nixl.json

The receiver allocates one tensor (cuda:0, or host memory with --memory cpu), registers
it and hands its NIXL agent metadata and address to the sender over a pipe. The sender
registers its tensor (random bytes from a fixed seed), loads the receiver's metadata and
posts one NIXL WRITE of the whole tensor with a notification, per iteration, on the same
transfer handle. The receiver waits for the notification, says so ("ack"), then checks
the tensor against the expected bytes with torch.equal on the GPU and zeroes it for the
next iteration. GB/s (1e9 bytes/s) is the sender's time from posting the WRITE to the
receiver's ack, median over --iters; one untimed warm-up transfer first (it makes the
UCX connection). Both the time to the sender's local DONE and to the ack are reported.

UCX is limited to TCP on the loopback device (UCX_TLS=tcp,cuda_copy; UCX_NET_DEVICES=lo)
unless those variables are set: left to itself UCX moves GPU to GPU on one host through
CUDA IPC or shared memory, which is not the TCP path. TCP cannot read GPU memory, so UCX
stages CUDA memory through host bounce buffers itself (its rendezvous pipeline over
cuda_copy); the bench never copies to the host. One JSON document to stdout.
"""

import argparse
import base64
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import (Buffers, LineChild, Parent, cuda_lib_env, die, log, parse_size,  # noqa: E402
                         summarize, watchdog)

PEER = "nixl"


def import_nixl():
    try:
        from nixl_cu13._api import nixl_agent, nixl_agent_config
        import nixl_cu13 as mod
        name = "nixl-cu13"
    except ImportError:
        from nixl._api import nixl_agent, nixl_agent_config
        import nixl as mod
        name = "nixl"
    try:
        from importlib.metadata import version
        ver = version(name)
    except Exception:
        ver = getattr(mod, "__version__", "unknown")
    return nixl_agent, nixl_agent_config, ver


def make_agent(name):
    nixl_agent, nixl_agent_config, ver = import_nixl()
    agent = nixl_agent(name, nixl_agent_config(backends=["UCX"]))
    if "UCX" not in agent.backends:
        raise RuntimeError(f"NIXL has no UCX backend (plugins: {agent.get_plugin_list()})")
    return agent, ver


def receiver(args):
    par = Parent()
    try:
        bufs = Buffers(args.memory)
        n = args.n
        target = bufs.zeros(n)
        expected = bufs.data(n)
        agent, _ = make_agent("receiver")
        mem = "VRAM" if args.memory == "cuda" else "DRAM"
        agent.register_memory([(bufs.ptr(target), n, 0, "")], mem)
        par.send({"meta": base64.b64encode(agent.get_agent_metadata()).decode(), "addr": bufs.ptr(target),
                  "backend_mem": [str(m) for m in agent.get_backend_mem_types("UCX")]})
    except Exception as e:
        par.send({"error": f"receiver setup: {type(e).__name__}: {e}"})
        raise
    pending = []
    for i in range(args.iters + 1):
        want = f"it{i}".encode()
        deadline = time.monotonic() + args.wait
        while want not in pending:
            if time.monotonic() > deadline:
                par.send({"error": f"no notification {want!r} within {args.wait} s"})
                sys.exit(1)
            for msgs in agent.get_new_notifs().values():
                pending.extend(msgs)
            if want not in pending:
                time.sleep(0.0002)  # leave the cores to UCX's progress thread
        pending.remove(want)
        par.send({"ack": i})
        eq = bufs.equal(target, expected)
        bufs.zero_(target)
        par.send({"checked": i, "equal": eq})
    par.recv()  # the sender's goodbye (or EOF), so that nothing is torn down mid-flight


def sender(args):
    n = args.n
    doc = {"peer": PEER, "version": None, "size": n, "memory": f"{args.memory}->{args.memory}",
           "iters": args.iters, "gb_per_s": [], "median": None, "exact": False}
    bufs = Buffers(args.memory)
    data = bufs.data(n)
    agent, ver = make_agent("sender")
    doc["version"] = ver
    mem = "VRAM" if args.memory == "cuda" else "DRAM"
    agent.register_memory([(bufs.ptr(data), n, 0, "")], mem)
    child = LineChild([sys.executable, os.path.abspath(__file__), "--role", "recv", "--size", str(n),
                       "--iters", str(args.iters), "--memory", args.memory, "--wait", str(args.wait)],
                      env=cuda_lib_env())
    try:
        info = child.recv(args.wait, "metadata")
        remote = agent.add_remote_agent(base64.b64decode(info["meta"]))
        if isinstance(remote, bytes):
            remote = remote.decode()
        local_d = agent.get_xfer_descs([(bufs.ptr(data), n, 0)], mem)
        remote_d = agent.get_xfer_descs([(info["addr"], n, 0)], mem)
        handle = agent.initialize_xfer("WRITE", local_d, remote_d, remote, b"it0")
        done_rates, ack_rates, exact, warm = [], [], True, None
        for i in range(args.iters + 1):
            t0 = time.perf_counter()
            state = agent.transfer(handle, f"it{i}".encode())
            deadline = time.monotonic() + args.wait
            while state == "PROC":
                if time.monotonic() > deadline:
                    raise TimeoutError(f"transfer {i} still in progress after {args.wait} s")
                state = agent.check_xfer_state(handle)
            t_done = time.perf_counter()
            if state != "DONE":
                raise RuntimeError(f"transfer {i}: state {state}")
            child.recv(args.wait, f"ack of transfer {i}")
            t_ack = time.perf_counter()
            chk = child.recv(args.wait, f"check of transfer {i}")
            exact &= bool(chk["equal"])
            if i == 0:
                warm = round(t_ack - t0, 4)
                continue
            done_rates.append(n / (t_done - t0) / 1e9)
            ack_rates.append(n / (t_ack - t0) / 1e9)
        child.send({"bye": True})
        doc["gb_per_s"], doc["median"] = summarize(ack_rates)
        doc["gb_per_s_local_done"], doc["median_local_done"] = summarize(done_rates)
        doc["exact"] = exact
        doc["warmup_s"] = warm
        doc["ucx_backend_mem_types"] = info.get("backend_mem")
    finally:
        child.close()
    doc["device"] = bufs.device_name()
    doc["env"] = {k: v for k, v in os.environ.items() if k.startswith("UCX_")}
    staging = ("UCX stages CUDA memory through host bounce buffers (rendezvous pipeline over cuda_copy): "
               "TCP cannot read GPU memory; the bench itself never copies to the host. "
               if args.memory == "cuda" else "")
    doc["notes"] = (f"{staging}One NIXL WRITE of the whole buffer per iteration on one reused transfer handle "
                    "(backend UCX, UCX_TLS/UCX_NET_DEVICES as in env), notification to the receiver; "
                    "gb_per_s is timed from posting the WRITE to the receiver's ack of the notification "
                    "(gb_per_s_local_done: to the sender's DONE). Every iteration checked on the receiver "
                    f"({'torch.equal on the GPU' if args.memory == 'cuda' else 'numpy array_equal'}) and "
                    "zeroed before the next; first transfer (connection set-up) untimed.")
    print(json.dumps(doc), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--memory", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--wait", type=float, default=120, help="seconds any one step may take")
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
            die(f"nixl sender: {type(e).__name__}: {e}")
    # main: the watchdog. UCX limited to TCP on loopback unless set otherwise.
    os.environ.setdefault("UCX_TLS", "tcp,cuda_copy" if args.memory == "cuda" else "tcp")
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    argv = [sys.executable, os.path.abspath(__file__), "--role", "send"] + sys.argv[1:]
    sys.exit(watchdog(argv, args.timeout, {"peer": PEER, "size": args.n,
                                           "memory": f"{args.memory}->{args.memory}", "iters": args.iters,
                                           "gb_per_s": [], "median": None}))


if __name__ == "__main__":
    main()
