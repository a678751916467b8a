#!/usr/bin/env python3
"""Where a plugin step's time goes: reads NCCL logs written with NCCL_GRDMA_TRACE=1 and
prints, per side, the median and 90th percentile of each stage of a request, in
microseconds (requests from --skip on: the first ones are warm-up).

    python3 tests/nccl/trace_steps.py trace.log [--skip 64]

Sender, per request sent to a receive it knew of: `cts_wait` (from its clear-to-send's
arrival to the isend: how long that receive was posted before the data was ready); per
request: `to_first` (isend to its first byte on a socket), `writing` (first to last byte
written), `to_ack` (last byte to the ack), `to_done` (last byte to `test` done),
`between` (one isend to the next of the comm). Receiver: `cts_to_last` (irecv, which
sends the clear-to-send, to its last byte read), `to_done` (last byte read to `test`
done), `between` (one irecv to the next). Comms are told apart by their `[comm N]`
(older logs without it: one comm per side and process; the ad-hoc `steps.py` in
docs/measurements/h100/2026-12-06-nccl-plugin/k-step-trace read those, by time).
"""
import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"^(?:(\S+?):(\d+):(\d+) )?.*NET/grdma : trace (send|recv) (req|#)\s?(\d+) "
                  r"\+(\d+)us @(\d+) (?:\[comm (\d+)\] )?(.*)$")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None


def main():
    args = sys.argv[1:]
    skip = 64
    if "--skip" in args:
        i = args.index("--skip")
        skip = int(args[i + 1])
        del args[i:i + 2]
    reqs = defaultdict(dict)   # (pid, side, comm, n) -> {event: wall}
    notes = defaultdict(dict)  # (pid, comm) -> {cts id: wall of "clear-to-send received"}
    for path in args:
        for line in open(path, errors="replace"):
            m = LINE.match(line.strip())
            if not m:
                continue
            _, pid, _, side, kind, n, _, wall, comm, what = m.groups()
            n, wall = int(n), int(wall)
            if kind == "#":
                mm = re.match(r"clear-to-send (\d+) received", what)
                if mm:
                    notes[(pid, comm)][int(mm.group(1))] = wall
                continue
            key = (pid, side, comm, n)
            for ev, pat in (("isend", r"^isend \d+ B tag \S+ (to|eager) (\d+)/"),
                            ("irecv", r"^irecv "), ("first", r"^first byte written"),
                            ("last", r"^last byte written"), ("ack", r"^ack received"),
                            ("done", r"^test done"), ("read", r"^last byte read")):
                mm = re.match(pat, what)
                if mm and ev not in reqs[key]:
                    reqs[key][ev] = wall
                    if ev == "isend":
                        reqs[key]["cts"] = int(mm.group(2)) if mm.group(1) == "to" else None
    stages = defaultdict(list)
    by_comm = defaultdict(list)
    for (pid, side, comm, n), e in sorted(reqs.items()):
        by_comm[(pid, side, comm)].append((n, e))
    for (pid, side, comm), items in by_comm.items():
        prev = None
        for n, e in items:
            if n < skip:
                prev = e
                continue
            if side == "send" and "isend" in e:
                c = notes[(pid, comm)].get(e.get("cts"))
                if c is not None:
                    stages["send cts_wait"].append(e["isend"] - c)
                for a, b, name in (("isend", "first", "to_first"), ("first", "last", "writing"),
                                   ("last", "ack", "to_ack"), ("last", "done", "to_done")):
                    if a in e and b in e:
                        stages[f"send {name}"].append(e[b] - e[a])
                if prev and "isend" in prev:
                    stages["send between"].append(e["isend"] - prev["isend"])
            if side == "recv" and "irecv" in e:
                if "read" in e:
                    stages["recv cts_to_last"].append(e["read"] - e["irecv"])
                if "read" in e and "done" in e:
                    stages["recv to_done"].append(e["done"] - e["read"])
                if prev and "irecv" in prev:
                    stages["recv between"].append(e["irecv"] - prev["irecv"])
            prev = e
    print(f"{'stage':24} {'n':>6} {'median':>8} {'p90':>8}  (us)")
    for k in sorted(stages):
        v = stages[k]
        print(f"{k:24} {len(v):6d} {statistics.median(v):8.0f} {pct(v, 0.9):8.0f}")


if __name__ == "__main__":
    main()
