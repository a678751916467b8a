#!/usr/bin/env bash
# The engine refactor's "no slower" figures on a GPU machine, in one run: GPU to GPU
# against host to host over TCP loopback at 1, 4 and 8 streams (tests/gpu-tcp-scaling.sh,
# 3 rounds), then `host bench tcp` against its plain-socket reference at 1, 4 and 8.
# Usage: BIN=dir-with-host OUT=logs tests/device/no-slower.sh
set -u
: "${BIN:?}" "${OUT:?}"
mkdir -p "$OUT"
echo "== GPU to GPU against host to host"
HOST_BIN="$BIN/host" LOG="$OUT/scaling" timeout 400 tests/gpu-tcp-scaling.sh 3 > "$OUT/scaling.json" 2> "$OUT/scaling.err"; echo "rc=$?"
cat "$OUT/scaling.json" | tail -30
for s in 1 4 8; do
  echo "== host bench tcp, $s streams"
  timeout 120 "$BIN/host" bench tcp --size 1GiB --streams "$s" --rounds 5 > "$OUT/bench-tcp-$s.json" 2> "$OUT/bench-tcp-$s.err"; echo "rc=$?"
  tail -c 600 "$OUT/bench-tcp-$s.json"; echo
done
