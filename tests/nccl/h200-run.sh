#!/usr/bin/env bash
# The NCCL plugin on a GPU machine (the H200): PyTorch's NCCL through NET/grdma against
# NCCL's own NET/Socket in the same run, at NCCL's defaults and tuned, with the checks
# on and off and with injected faults. Two ranks on one GPU (tests/nccl/torch_bench.py).
#
#   tests/nccl/h200-run.sh                       # logs and JSON under $OUT (or target/nccl-h200)
#   PLUGIN=/path/libnccl-net-grdma.so MAX_BYTES=256MiB tests/nccl/h200-run.sh
#   RUNS="socket-default grdma-default" tests/nccl/h200-run.sh   # a subset (one run is about a minute)
#   RUNS=streams-sweep tests/nccl/h200-run.sh    # send/recv at SWEEP_BYTES (256MiB) only, NCCL's
#       defaults: grdma at NCCL_GRDMA_STREAMS=1,2,4,8 against Socket at NCCL_SOCKET_NTHREADS=1,2,4,8
#       (one socket per thread); about 20 s per point
#   RUNS="grdma-default grdma-default-by-number" tests/nccl/h200-run.sh   # the same at
#       NCCL's defaults with NCCL_GRDMA_EAGER_BY_NUMBER=1 (eager messages placed by number)
#   RUNS=grdma-trace tests/nccl/h200-run.sh      # send/recv 1KiB..1MiB with NCCL_GRDMA_TRACE=1:
#       every step of each comm's first 200 requests in grdma-trace.log (where an op's time goes)
#   (A/B of plugin builds or settings, alternated in rounds: tests/nccl/ab.sh)
#   RUNS=plugin-bench HARNESS=path/to/harness-<hash> tests/nccl/h200-run.sh   # the plugin alone,
#       no NCCL, no GPU: nccl-net/tests/harness.rs's bench_loopback at NCCL_GRDMA_STREAMS=1,4,8
#       (cargo test --release -p nccl-net --test harness --no-run prints the binary); seconds each
#
# PLUGIN defaults to target/plugin/libnccl-net-grdma.so (tests/nccl/build-plugin.sh, run
# here if cargo is present). Each configuration writes <label>.json and <label>.log
# (NCCL_DEBUG=INFO); the script fails if a result is not bit-exact, if a grdma run's log
# lacks "via NET/grdma" (or a Socket run's "via NET/Socket"), or if the injected-fault
# run repaired nothing. summary.json: every run's GB/s per op and size, and grdma/Socket
# ratios for the default and the tuned pair.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/target/nccl-h200}"
mkdir -p "$OUT"
MAX_BYTES="${MAX_BYTES:-1GiB}"
STREAMS="${NCCL_GRDMA_STREAMS:-4}"
PY="${PYTHON:-python3}"

if [ -z "${PLUGIN:-}" ]; then
    PLUGIN="$PWD/target/plugin/libnccl-net-grdma.so"
    if [ ! -f "$PLUGIN" ] && command -v cargo >/dev/null; then
        PLUGIN="$(bash tests/nccl/build-plugin.sh)"
    fi
fi
[ -f "$PLUGIN" ] || { echo "h200-run: no plugin at $PLUGIN (run tests/nccl/build-plugin.sh)" >&2; exit 1; }
newest=$(objdump -T "$PLUGIN" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1 || true)
echo "h200-run: plugin $PLUGIN (needs ${newest:-?}), streams $STREAMS, sizes 1KiB..$MAX_BYTES, out $OUT"
"$PY" -c 'import torch; print("h200-run: torch", torch.__version__, "NCCL", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'

TUNED=(NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_BUFFSIZE=16777216)
# NCCL's Socket with as many sockets as the plugin has streams, a helper thread each
# (as the plugin has a writer or reader thread per socket).
SOCKET_TUNED=(NCCL_NSOCKS_PERTHREAD=1 NCCL_SOCKET_NTHREADS="$STREAMS")
GRDMA=(NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=grdma NCCL_GRDMA_STREAMS="$STREAMS")
# At NCCL's defaults the plugin chooses its own sockets too (NCCL_GRDMA_STREAMS unset: the
# --streams auto rule for the device), unless NCCL_GRDMA_STREAMS was given to this script.
if [ -n "${NCCL_GRDMA_STREAMS:-}" ]; then GRDMA_OWN=("${GRDMA[@]}"); else
    GRDMA_OWN=(NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=grdma); fi

ALL_RUNS="socket-default grdma-default socket-tuned grdma-tuned grdma-tuned-checks-off grdma-faults-1e3 grdma-faults-small"
RUNS="${RUNS:-$ALL_RUNS}"
SWEEP_BYTES="${SWEEP_BYTES:-256MiB}"
fail=0
run() { # label, expected "via NET/x", env...   (BENCH_ARGS: extra torch_bench.py arguments)
    local label=$1 via=$2
    shift 2
    case " $RUNS " in *" $label "*) ;; *) return ;; esac
    echo "==> $label: $*"
    if ! env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV "$@" \
        "$PY" tests/nccl/torch_bench.py --label "$label" --out "$OUT/$label.json" \
        --max-bytes "$MAX_BYTES" ${BENCH_ARGS:-} >"$OUT/$label.log" 2>&1; then
        echo "h200-run: $label FAILED (see $OUT/$label.log)"; tail -20 "$OUT/$label.log"; fail=1; return
    fi
    grep -E ' (send_recv|all_reduce) ' "$OUT/$label.log" | tail -4
    if ! grep -q "via NET/$via" "$OUT/$label.log"; then
        echo "h200-run: $label: NCCL's log never says 'via NET/$via'"; fail=1
    fi
}

run socket-default Socket NCCL_NET=Socket
run grdma-default grdma "${GRDMA_OWN[@]}"
run socket-tuned Socket NCCL_NET=Socket "${TUNED[@]}" "${SOCKET_TUNED[@]}"
run grdma-tuned grdma "${GRDMA[@]}" "${TUNED[@]}"
run grdma-tuned-checks-off grdma "${GRDMA[@]}" "${TUNED[@]}" NCCL_GRDMA_CHECKS=0
run grdma-faults-1e3 grdma "${GRDMA_OWN[@]}" NCCL_GRDMA_TEST_INJECT_FAULTS=1000
# Small messages, where NCCL uses its LL and LL128 protocols (the GPU reads the buffer as
# the bytes come, not after `test`), with a piece in three corrupted: exact only if no
# corrupt byte ever reaches NCCL's buffer (nccl-net/src/comm/recv.rs, `must_stage`).
MAX_BYTES=256KiB run grdma-faults-small grdma "${GRDMA_OWN[@]}" NCCL_GRDMA_TEST_INJECT_FAULTS=3
# Not in the default set: eager messages placed by their number (an option until an A/B
# such as RUNS="socket-default grdma-default grdma-default-by-number" says it gains).
run grdma-default-by-number grdma "${GRDMA_OWN[@]}" NCCL_GRDMA_EAGER_BY_NUMBER=1

if [[ " $RUNS " == *" streams-sweep "* ]]; then
    for n in 1 2 4 8; do
        RUNS="grdma-streams-$n socket-threads-$n" MAX_BYTES="$SWEEP_BYTES" \
            BENCH_ARGS="--ops send_recv --min-bytes $SWEEP_BYTES" \
            run "grdma-streams-$n" grdma NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=grdma NCCL_GRDMA_STREAMS="$n"
        RUNS="grdma-streams-$n socket-threads-$n" MAX_BYTES="$SWEEP_BYTES" \
            BENCH_ARGS="--ops send_recv --min-bytes $SWEEP_BYTES" \
            run "socket-threads-$n" Socket NCCL_NET=Socket NCCL_NSOCKS_PERTHREAD=1 NCCL_SOCKET_NTHREADS="$n"
    done
fi

# NCCL_GRDMA_TRACE=1: each comm's first 200 requests step by step in the log (isend/irecv,
# clear-to-send, first/last byte, ack, eager match and copy, test done), send/recv to 1 MiB.
if [[ " $RUNS " == *" grdma-trace "* ]]; then
    MAX_BYTES=1MiB BENCH_ARGS="--ops send_recv" \
        run grdma-trace grdma "${GRDMA[@]}" NCCL_GRDMA_TRACE=1
    echo "h200-run: grdma-trace: $(grep -c 'NET/grdma : trace ' "$OUT/grdma-trace.log" || true) trace lines in $OUT/grdma-trace.log"
fi

if [[ " $RUNS " == *" plugin-bench "* ]]; then
    if [ -x "${HARNESS:-}" ]; then
        for n in 1 4 8; do
            echo "==> plugin-bench-$n: bench_loopback, NCCL_GRDMA_STREAMS=$n"
            if NCCL_GRDMA_PLUGIN="$PLUGIN" NCCL_GRDMA_STREAMS="$n" timeout 120 "$HARNESS" --ignored \
                --exact bench_loopback --nocapture >"$OUT/plugin-bench-$n.log" 2>&1; then
                grep GBps "$OUT/plugin-bench-$n.log" | tee "$OUT/plugin-bench-$n.jsonl"
            else
                echo "h200-run: plugin-bench-$n FAILED (see $OUT/plugin-bench-$n.log)"; fail=1
            fi
        done
    else
        echo "h200-run: plugin-bench needs HARNESS=<the harness test binary>"; fail=1
    fi
fi

# The injected faults must have been repaired, and every result bit-exact (a result that
# is not fails the run above; said again here beside the count).
for label in grdma-faults-1e3 grdma-faults-small; do
    if [ -f "$OUT/$label.log" ] && [[ " $RUNS " == *" $label "* ]]; then
        repaired=$(grep -o '[0-9]* messages, [0-9]* bytes, [0-9]* pieces sent again' "$OUT/$label.log" \
            | awk '{s += $5} END {print s + 0}')
        mismatched=$(grep -c ' MISMATCH$' "$OUT/$label.log" || true)
        case $mismatched in
            0) said="every result bit-exact" ;;
            *) said="$mismatched results NOT bit-exact"; fail=1 ;;
        esac
        echo "h200-run: $label sent $repaired pieces again after a failed CRC32C ($said)"
        [ "$repaired" -gt 0 ] || { echo "h200-run: $label: injected faults, none repaired"; fail=1; }
    fi
done

"$PY" - "$OUT" <<'PYEOF'
import json, os, sys
out = sys.argv[1]
runs = {}
for f in sorted(os.listdir(out)):
    if f.endswith(".json") and f != "summary.json":
        with open(os.path.join(out, f)) as fh:
            d = json.load(fh)
        runs[d["label"]] = d
table = {l: {f'{r["op"]}/{r["bytes"]}': r["GBps"] for r in d["results"]} for l, d in runs.items()}
ratios = {}
pairs = [("grdma-default", "socket-default"), ("grdma-tuned", "socket-tuned")]
pairs += [(f"grdma-streams-{n}", f"socket-threads-{n}") for n in (1, 2, 4, 8)]
for a, b in pairs:
    if a in table and b in table:
        ratios[f"{a}/{b}"] = {k: round(v / table[b][k], 3) for k, v in table[a].items() if table[b].get(k)}
doc = {"runs": table, "ratios": ratios,
       "exact": {l: all(r["exact"] for r in d["results"]) for l, d in runs.items()},
       "meta": {l: {k: d[k] for k in ("torch", "nccl", "gpu", "env")} for l, d in runs.items()}}
with open(os.path.join(out, "summary.json"), "w") as fh:
    json.dump(doc, fh, indent=1)
for name, r in ratios.items():
    big = [k for k in r if k.endswith(f"/{max(int(x.split('/')[1]) for x in r)}")]
    print(f"h200-run: {name} at the largest size: " + ", ".join(f"{k} {r[k]}x" for k in big))
PYEOF
echo "h200-run: summary $OUT/summary.json"
exit $fail
