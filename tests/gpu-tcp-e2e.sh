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
# A rejected offer does not use --once up: the next, verified transfer does.
timeout 120 "$BIN" 127.0.0.1 "$PORT" --transport tcp --mem staged --size 1MiB >"$LOG/once3-send.log" 2>&1 || { echo "FAIL: the transfer after the reject"; cat "$LOG/once3-send.log"; fail=1; }
timeout 30 tail --pid="$RPID" -f /dev/null; wait "$RPID"; rc=$?
[ "$rc" = 0 ] && echo "ok   --once kept serving after a rejected offer ($(grep -o 'error: .*' "$LOG/once2-send.log")), then exit 0 after a verified one" || { echo "FAIL --once exit $rc"; cat "$LOG/once2.log"; fail=1; }

# Several GPU senders into one GPU receiver at once: each transfer on a thread of its own
# with its own upload ring and copy stream; all verified by the verify kernel.
"$BIN" recv --transport tcp --mem device --bind 127.0.0.1 --port "$PORT" --max-bytes 1GiB --max-memory 16GiB --timeout 60 >"$LOG/many.log" 2>&1 &
RPID=$!
wait_listening "$LOG/many.log" || exit 1
# First a sender that stalls holding its connection (50 transfers on one, stopped after
# 2 s): it must hold up no one.
timeout 300 "$BIN" 127.0.0.1 "$PORT" --transport tcp --mem staged --size 1GiB --streams 2 --reuse-connection --iters 50 --timeout 60 >"$LOG/many-stalled.log" 2>&1 &
stalled=$!
sleep 2; kill -STOP "$stalled"
pids=()
started=$(date +%s.%N)
for k in 1 2 3 4 5 6; do
    timeout 300 "$BIN" 127.0.0.1 "$PORT" --transport tcp --mem staged --size 256MiB --streams 2 --iters 2 --timeout 60 >"$LOG/many-$k.log" 2>&1 &
    pids+=($!)
done
many_ok=0
for k in 1 2 3 4 5 6; do
    wait "${pids[$((k - 1))]}" && [ "$(grep -c 'Receiver: verified' "$LOG/many-$k.log")" = 2 ] && many_ok=$((many_ok + 1))
done
took=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$started" "$(date +%s.%N)")
kill -KILL "$stalled" 2>/dev/null; wait "$stalled" 2>/dev/null
kill "$RPID" 2>/dev/null; wait "$RPID" 2>/dev/null
many_verified=$(grep -c "verification: all .* elements match the pattern" "$LOG/many.log")
if [ "$many_ok" = 6 ] && [ "$many_verified" = 12 ]; then
    echo "ok   6 GPU senders at once into one GPU receiver: 12 of 12 transfers verified by the verify kernel, all done in $took s, beside a stalled sender"
else
    echo "FAIL: senders at once: $many_ok of 6 senders ok, $many_verified of 12 verified"; tail -20 "$LOG/many.log"; fail=1
fi
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
