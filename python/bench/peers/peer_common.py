"""Shared pieces of the peer benchmarks (nixl_bench.py, mooncake_bench.py).

Each benchmark runs as three processes: the command you start (the watchdog), which
runs the sender in a new process session and kills that whole session when its time is
up; the sender, which starts the receiver and talks to it over its stdin/stdout in JSON
lines; and the receiver. Every wait has a deadline: a hung library call ends in the
watchdog's kill and an error document, never a hang.
"""

import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time

SEED = 1234


def parse_size(s):
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if s.endswith(unit):
            return int(float(s[: -len(unit)]) * m)
    return int(s)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def die(msg, code=1):
    log(f"error: {msg}")
    sys.exit(code)


# ---- buffers: torch tensors on cuda:0, or numpy arrays in host memory ------------------

class Buffers:
    """The data to send or the tensor to receive into; `memory` is "cuda" or "cpu"."""

    def __init__(self, memory):
        self.memory = memory
        if memory == "cuda":
            import torch
            if not torch.cuda.is_available():
                die("memory=cuda but torch sees no CUDA device")
            torch.cuda.init()
            self.torch = torch
        else:
            import numpy
            self.np = numpy

    def data(self, n, seed=SEED):
        if self.memory == "cuda":
            g = self.torch.Generator(device="cuda")
            g.manual_seed(seed)
            t = self.torch.randint(0, 256, (n,), dtype=self.torch.uint8, device="cuda", generator=g)
            self.torch.cuda.synchronize()
            return t
        return self.np.random.default_rng(seed).integers(0, 256, n, dtype=self.np.uint8)

    def zeros(self, n):
        if self.memory == "cuda":
            t = self.torch.zeros(n, dtype=self.torch.uint8, device="cuda")
            self.torch.cuda.synchronize()
            return t
        return self.np.zeros(n, dtype=self.np.uint8)

    def zero_(self, t):
        if self.memory == "cuda":
            t.zero_()
            self.torch.cuda.synchronize()
        else:
            t.fill(0)

    def ptr(self, t):
        return t.data_ptr() if self.memory == "cuda" else t.ctypes.data

    def equal(self, a, b):
        if self.memory == "cuda":
            return bool(self.torch.equal(a, b))  # on the GPU
        return bool(self.np.array_equal(a, b))

    def device_name(self):
        if self.memory == "cuda":
            return self.torch.cuda.get_device_name(0)
        return "host"


def cuda_lib_env():
    """LD_LIBRARY_PATH with the folder of the libcudart.so.13 that torch loaded, so that
    libraries asking for it by name (UCX's CUDA module, Mooncake's engine) find it."""
    env = dict(os.environ)
    dirs = set()
    try:
        for line in open("/proc/self/maps"):
            p = line.split()[-1]
            if "/libcudart.so" in p:
                dirs.add(os.path.dirname(p))
    except OSError:
        pass
    if dirs:
        env["LD_LIBRARY_PATH"] = ":".join(sorted(dirs) + [env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    return env


# ---- line-oriented JSON pipes with deadlines --------------------------------------------

class LineChild:
    """A child process spoken to in JSON lines on stdin/stdout; stderr passes through."""

    def __init__(self, argv, env=None):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, bufsize=1, env=env)
        self.q = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.p.stdout:
            self.q.put(line)
        self.q.put(None)

    def send(self, obj):
        self.p.stdin.write(json.dumps(obj) + "\n")
        self.p.stdin.flush()

    def recv(self, timeout, what):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"receiver: no {what} within {timeout:.0f} s")
            try:
                line = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"receiver exited (rc={self.p.wait(5)}) before {what}")
            line = line.strip()
            if not line.startswith("{"):
                log(f"receiver: {line}")  # a library that prints to stdout
                continue
            msg = json.loads(line)
            if "error" in msg:
                raise RuntimeError(f"receiver: {msg['error']}")
            return msg

    def close(self, timeout=20):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(5)


class Parent:
    """The receiver's side of the pipe: reads the sender's lines, answers in JSON lines.
    stdout is kept for the protocol; anything a library prints goes to stderr."""

    def __init__(self):
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)  # libraries' printf to stdout lands on stderr
        sys.stdout = sys.stderr

    def send(self, obj):
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()

    def recv(self):
        line = sys.stdin.readline()
        if not line:
            sys.exit(0)  # the sender went away: stop
        return json.loads(line)


# ---- the watchdog -----------------------------------------------------------------------

def watchdog(argv, timeout, doc_on_failure):
    """Run the sender in a new session; on timeout kill the session (sender, receiver and
    whatever they started). Print the sender's JSON, or an error document."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rc = None
    lines = out.strip().splitlines()
    for line in lines[:-1]:
        log(line)  # what a library printed to the sender's stdout (UCX_PROTO_INFO, say)
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        log(lines[-1])
        doc = None
    if doc is None:
        doc = dict(doc_on_failure)
        doc["exact"] = False
        doc["error"] = (f"timed out after {timeout} s (killed)" if rc is None
                        else f"sender exited with rc={rc} and no result (see stderr)")
        log(f"error: {doc['error']}")
    try:
        os.killpg(p.pid, signal.SIGKILL)  # leftovers of that session, if any
    except ProcessLookupError:
        pass
    print(json.dumps(doc, indent=1))
    return 0 if doc.get("exact") else 1


def summarize(rates):
    return [round(r, 3) for r in rates], round(statistics.median(rates), 3) if rates else None
