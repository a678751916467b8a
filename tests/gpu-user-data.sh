#!/usr/bin/env bash
# Your own data through GPU memory at both ends over TCP loopback, on a machine with a
# GPU (the H200): a file placed in the sender's GPU memory, every chunk's CRC32C computed
# there by the checksum kernel, the chunks staged through host memory into the socket,
# landed in the receiver's GPU memory and checked there by the same kernel, then written
# out; SHA-256 equal. Then with faults injected (repaired into GPU memory), the pattern
# checked both ways, the library's examples, and the cost of the checksums: 1 GiB with
# --verify checksum against --verify off, interleaved, 5 rounds each, one JSON summary.
#
#   cargo build --release -p host -p host-examples && tests/gpu-user-data.sh
#   (HOST_BIN, EXAMPLES (directory of send-buffer and receive-buffer), OUT_DIR, DATA_DIR)
set -u
cd "$(dirname "$0")/.."
BIN=${HOST_BIN:-target/release/host}
EXAMPLES=${EXAMPLES:-target/release}
OUT=${OUT_DIR:-target/gpu-user-data}
DATA=${DATA_DIR:-/tmp/gpu-user-data} # about 3 GiB
ROUNDS=${ROUNDS:-5}
mkdir -p "$OUT" "$DATA/in" "$DATA/out"
rm -f "$DATA/out/"*
fail=0
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done' EXIT

port_of() { # $1 log: the port of its "listening on ADDR:PORT" line, within 30 s
    for _ in $(seq 300); do
        p=$(grep -o 'listening on [0-9.]*:[0-9]*' "$1" 2>/dev/null | head -1 | grep -o '[0-9]*$')
        [ -n "$p" ] && { echo "$p"; return 0; }
        sleep 0.1
    done
    echo "FAIL: no receiver in $1:" >&2; cat "$1" >&2; return 1
}
json() { python3 -c "import json,sys; d=json.load(open('$1')); print($2)"; }

head -c $((1073741824 + 3)) /dev/urandom >"$DATA/in/data.bin"
want=$(sha256sum <"$DATA/in/data.bin" | cut -d' ' -f1)

"$BIN" recv --transport tcp --mem device --gpu 0 --bind 127.0.0.1 --port 0 --output "$DATA/out" \
    --max-bytes 2GiB --max-memory 16GiB --timeout 60 >"$OUT/recv.log" 2>&1 &
pids+=($!)
PORT=$(port_of "$OUT/recv.log") || exit 1

send() { # $1 name, rest: options
    name=$1; shift
    timeout 300 "$BIN" 127.0.0.1 "$PORT" --transport tcp --gpu 0 --timeout 60 --json "$@" \
        >"$OUT/$name.json" 2>"$OUT/$name.log"
}

# 1. The file, from GPU memory to GPU memory, checksummed on both GPUs.
if send user-1g --mem staged --input "$DATA/in/data.bin" --streams 4 --name data.bin \
    && [ "$(json "$OUT/user-1g.json" 'd["ok"]')" = True ] \
    && [ "$(json "$OUT/user-1g.json" 'd["path"]')" = staged-through-host-memory ]; then
    got=$(sha256sum <"$DATA/out/data.bin" | cut -d' ' -f1)
    if [ "$got" = "$want" ]; then
        echo "ok   1 GiB + 3 B from GPU memory into GPU memory, SHA-256 $got equal; $(grep -m1 'checksums:' "$OUT/recv.log")"
    else
        echo "FAIL: SHA-256 $got, sent $want"; fail=1
    fi
else
    echo "FAIL user-1g:"; cat "$OUT/user-1g.log"; fail=1
fi

# 2. Faults injected at 1 in 100 chunks: found by the kernel in the receiver's GPU
#    memory, sent again into the same place.
rm -f "$DATA/out/data.bin"
if send faults --mem staged --input "$DATA/in/data.bin" --streams 4 --chunk 256KiB --name data.bin \
    --test-inject-faults 1/100 && [ "$(json "$OUT/faults.json" 'd["ok"]')" = True ]; then
    repaired=$(json "$OUT/faults.json" 'len(d["iterations"][0]["integrity"]["repaired"])')
    got=$(sha256sum <"$DATA/out/data.bin" | cut -d' ' -f1)
    [ "$got" = "$want" ] && [ "$repaired" -gt 0 ] \
        && echo "ok   faults at 1/100 into GPU memory: $repaired chunks repaired, SHA-256 equal" \
        || { echo "FAIL faults: $repaired repaired, SHA-256 $got"; fail=1; }
else
    echo "FAIL faults:"; cat "$OUT/faults.log"; fail=1
fi

# 3. The pattern, checked both ways on the GPU: elements and chunk checksums.
send both --mem staged --size 1GiB --streams 4 --verify both \
    && [ "$(json "$OUT/both.json" 'd["ok"]')" = True ] \
    && echo "ok   the pattern with --verify both: $(grep -m1 'all 268435456 elements' "$OUT/recv.log" | cut -c1-60)..." \
    || { echo "FAIL both:"; cat "$OUT/both.log"; fail=1; }

# 4. The library's examples, GPU buffer to GPU buffer.
"$EXAMPLES/receive-buffer" >"$OUT/receive-buffer.log" 2>&1 &
rb=$!; pids+=($rb)
for _ in $(seq 100); do grep -q "listening on" "$OUT/receive-buffer.log" && break; sleep 0.1; done
addr=$(grep -o '127.0.0.1:[0-9]*' "$OUT/receive-buffer.log" | head -1)
timeout 120 "$EXAMPLES/send-buffer" "$addr" 268435459 >"$OUT/send-buffer.log" 2>&1
wait "$rb"; rc=$?
if [ "$rc" = 0 ] && grep -q "sending from GPU memory" "$OUT/send-buffer.log" \
    && grep -q "checked again in GPU memory" "$OUT/receive-buffer.log"; then
    echo "ok   examples: $(tail -1 "$OUT/send-buffer.log" | cut -c1-90)...; $(tail -1 "$OUT/receive-buffer.log")"
else
    echo "FAIL examples (receiver exit $rc):"; cat "$OUT/send-buffer.log" "$OUT/receive-buffer.log"; fail=1
fi

# 5. The checksums' cost: the same 1 GiB file from GPU memory into GPU memory, with and
#    without, interleaved.
for r in $(seq "$ROUNDS"); do
    for mode in checksum off; do
        rm -f "$DATA/out/data.bin"
        send "cost-$mode-$r" --mem staged --input "$DATA/in/data.bin" --streams 4 --name data.bin \
            --verify "$mode" || { echo "FAIL cost-$mode-$r:"; cat "$OUT/cost-$mode-$r.log"; fail=1; }
    done
done
python3 - "$OUT" "$ROUNDS" <<'EOF' | tee "$OUT/checksum-cost.json"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def runs(mode):
    rs = []
    for r in range(1, rounds + 1):
        it = json.load(open(f"{out}/cost-{mode}-{r}.json"))["iterations"][0]
        rs.append({"gb_per_s": it["gb_per_s"], "round_trip_s": it["round_trip_seconds"]})
    return rs
on, off = runs("checksum"), runs("off")
med = lambda rs, k: statistics.median(r[k] for r in rs)
print(json.dumps({
    "what": "1 GiB + 3 B file, GPU memory to GPU memory over TCP loopback, 4 streams, 1 MiB chunks",
    "rounds": rounds,
    "checksum": on, "off": off,
    "median_gb_per_s": {"checksum": med(on, "gb_per_s"), "off": med(off, "gb_per_s")},
    "median_round_trip_s": {"checksum": med(on, "round_trip_s"), "off": med(off, "round_trip_s")},
    "throughput_ratio": med(on, "gb_per_s") / med(off, "gb_per_s"),
    "round_trip_ratio": med(off, "round_trip_s") / med(on, "round_trip_s"),
}, indent=1))
EOF
exit $fail
