#!/usr/bin/env bash
# GPU to GPU against host to host over TCP loopback, at 1, 4 and 8 streams, interleaved in
# one run, on a machine with a GPU (the H200): two processes, 1 GiB, --iters 3. GPU to GPU
# is `--mem staged` into `recv --mem device` (the sender's kernel writes GPU memory, its
# staged ring brings it to the sockets, the receiver's upload ring into GPU memory, the
# verify kernel checks it); host to host is `--gpu none` into `recv --mem host` (the same
# bytes, sockets and streams, no GPU). Prints one JSON object: every round's GB/s (the
# senders' aggregate over their 3 transfers, each verified) and the median ratios.
#
#   cargo build --release -p host && tests/gpu-tcp-scaling.sh [ROUNDS]
set -u
cd "$(dirname "$0")/.."
BIN=${HOST_BIN:-target/release/host}
ROUNDS=${1:-3}
SIZE=${SIZE:-1GiB}
LOG=${LOG:-target/gpu-tcp-scaling}
mkdir -p "$LOG"

wait_listening() { # $1 log file
    for _ in $(seq 300); do grep -q "listening on" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "receiver did not start: $(cat "$1")" >&2
    return 1
}

"$BIN" recv --transport tcp --mem device --bind 127.0.0.1 --port 7491 --max-bytes 2GiB --max-memory 64GiB --timeout 60 >"$LOG/recv-device.log" 2>&1 &
DPID=$!
"$BIN" recv --transport tcp --mem host --bind 127.0.0.1 --port 7492 --max-bytes 2GiB --max-memory 64GiB --timeout 60 >"$LOG/recv-host.log" 2>&1 &
HPID=$!
trap 'kill "$DPID" "$HPID" 2>/dev/null' EXIT
wait_listening "$LOG/recv-device.log" && wait_listening "$LOG/recv-host.log" || exit 1

results="$LOG/results.tsv"
: >"$results"
for round in $(seq "$ROUNDS"); do
    for streams in 1 4 8; do
        for kind in gpu host; do
            if [ "$kind" = gpu ]; then args=(7491 --mem staged); else args=(7492 --gpu none); fi
            out="$LOG/$kind-$streams-$round.json"
            if timeout 300 "$BIN" 127.0.0.1 "${args[@]}" --transport tcp --size "$SIZE" \
                --streams "$streams" --iters 3 --timeout 60 --json >"$out" 2>"$out.err"; then
                gbs=$(python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["aggregate"]; print(a.get("gb_per_s", a.get("gbps")))' "$out")
                printf '%s\t%s\t%s\t%s\n' "$round" "$streams" "$kind" "$gbs" >>"$results"
            else
                echo "FAILED: $kind, $streams streams, round $round: $(tail -3 "$out.err")" >&2
                exit 1
            fi
        done
    done
done
python3 - "$results" "$SIZE" <<'EOF'
import json, statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
out = {"what": "GPU to GPU (--mem staged into recv --mem device) against host to host "
               "(--gpu none into recv --mem host), TCP loopback, --iters 3, sender's aggregate GB/s",
       "size": sys.argv[2], "unit": "GB/s = 1e9 bytes/s", "streams": {}}
for s in ("1", "4", "8"):
    gpu = [float(r[3]) for r in rows if r[1] == s and r[2] == "gpu"]
    host = [float(r[3]) for r in rows if r[1] == s and r[2] == "host"]
    ratios = [g / h for g, h in zip(gpu, host)]
    out["streams"][s] = {"gpu_to_gpu": gpu, "host_to_host": host,
                         "ratio_per_round": [round(r, 3) for r in ratios],
                         "median_ratio": round(statistics.median(ratios), 3)}
print(json.dumps(out, indent=1))
EOF
