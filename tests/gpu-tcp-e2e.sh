#!/usr/bin/env bash
# The whole GPU pipeline end to end over TCP loopback, on a machine with a GPU and no
# RDMA NIC (the H200): the sender's kernel writes GPU memory (--mem staged, mapped,
# auto), TCP carries it, the receiver copies it into GPU memory and its verify kernel
# checks every element. 16 KiB to 1 GiB, --iters 3, 1 and 4 streams; then a --once
# receiver's exit codes, and --mem device (GPUDirect RDMA only) refused over TCP. Exit 0 only if every run passed.
#
#   cargo build --release -p host && tests/gpu-tcp-e2e.sh          # HOST_BIN=... to use another binary
set -u
cd "$(dirname "$0")/.."
BIN=${HOST_BIN:-target/release/host}
PORT=${PORT:-7481}
LOG=${LOG:-target/gpu-tcp-e2e}
mkdir -p "$LOG"
fail=0
runs=0

wait_listening() { # $1 log file
    for _ in $(seq 300); do grep -q "listening on" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "FAIL: receiver did not start:"; cat "$1"; return 1
}

"$BIN" recv --transport tcp --mem device --bind 127.0.0.1 --port "$PORT" --max-bytes 1GiB --timeout 60 >"$LOG/recv.log" 2>&1 &
RPID=$!
trap 'kill "$RPID" 2>/dev/null' EXIT
wait_listening "$LOG/recv.log" || exit 1

for mem in staged mapped auto; do
    for size in 16KiB 1000004 1MiB 64MiB 256MiB 1GiB; do
        for streams in 1 4; do
            runs=$((runs + 3))
            name="$mem-$size-$streams"
            if timeout 600 "$BIN" 127.0.0.1 "$PORT" --transport tcp --mem "$mem" --size "$size" \
                --streams "$streams" --iters 3 --timeout 60 >"$LOG/$name.log" 2>&1 \
                && [ "$(grep -c 'Receiver: verified' "$LOG/$name.log")" = 3 ]; then
                echo "ok   $name: $(grep aggregate "$LOG/$name.log")"
            else
                echo "FAIL $name:"; cat "$LOG/$name.log"; fail=1
            fi
        done
    done
done
kill "$RPID" 2>/dev/null; wait "$RPID" 2>/dev/null
verified=$(grep -c "verification: all .* elements match the pattern" "$LOG/recv.log")
staged=$(grep -c "into host memory, staged to the GPU" "$LOG/recv.log")
echo "receiver: $verified of $runs transfers verified by the verify kernel ($staged landed in GPU memory)"
[ "$verified" = "$runs" ] && [ "$staged" = "$runs" ] || { echo "FAIL: receiver log:"; tail -50 "$LOG/recv.log"; fail=1; }

# --once: exit 0 after a verified transfer, 1 after a rejected one.
"$BIN" recv --transport tcp --mem device --bind 127.0.0.1 --port "$PORT" --once >"$LOG/once.log" 2>&1 &
RPID=$!
wait_listening "$LOG/once.log" || exit 1
timeout 120 "$BIN" 127.0.0.1 "$PORT" --transport tcp --mem staged --size 64MiB >"$LOG/once-send.log" 2>&1 || { echo "FAIL once sender"; cat "$LOG/once-send.log"; fail=1; }
wait "$RPID"; rc=$?
[ "$rc" = 0 ] && echo "ok   --once after a verified transfer: exit 0" || { echo "FAIL --once exit $rc"; cat "$LOG/once.log"; fail=1; }
"$BIN" recv --transport tcp --mem device --bind 127.0.0.1 --port "$PORT" --once --max-bytes 1MiB >"$LOG/once2.log" 2>&1 &
RPID=$!
wait_listening "$LOG/once2.log" || exit 1
timeout 120 "$BIN" 127.0.0.1 "$PORT" --transport tcp --mem staged --size 64MiB >"$LOG/once2-send.log" 2>&1 && { echo "FAIL: oversized accepted"; fail=1; }
wait "$RPID"; rc=$?
[ "$rc" = 1 ] && echo "ok   --once after a rejected offer: exit 1 ($(grep -o 'error: .*' "$LOG/once2-send.log"))" || { echo "FAIL --once exit $rc"; fail=1; }
# --mem device is strict: GPUDirect RDMA or an error with the reason, never a silent change.
if "$BIN" 127.0.0.1 "$PORT" --transport tcp --mem device >"$LOG/device-send.log" 2>&1; then
    echo "FAIL: --mem device over TCP accepted"; fail=1
elif grep -q "error: --mem device asks for GPUDirect RDMA" "$LOG/device-send.log"; then
    echo "ok   --mem device over TCP refused: $(grep -o 'error: .*' "$LOG/device-send.log" | cut -c1-100)..."
else
    echo "FAIL: --mem device over TCP:"; cat "$LOG/device-send.log"; fail=1
fi
trap - EXIT
[ "$fail" = 0 ] && echo "ALL PASSED" || echo "SOME FAILED (logs in $LOG)"
exit "$fail"
