#!/usr/bin/env bash
# Is the one 15 s pass of the last run reproducible? The CLI GPU to GPU over TCP, three
# rounds of 1, 4 and 8 streams, 5 transfers each, against one `--mem device` receiver.
set -u
# Usage: BIN=dir-with-host OUT=logs tests/device/gpu-tcp-rounds.sh
: "${BIN:?}" "${OUT:?}"
mkdir -p "$OUT"
H="$BIN"/host
$H recv --transport tcp --mem device --bind 127.0.0.1 --port 7592 --max-bytes 2GiB --max-memory 64GiB --timeout 60 > "$OUT/recv.log" 2>&1 &
R=$!
for _ in $(seq 300); do grep -q "listening on" "$OUT/recv.log" && break; sleep 0.1; done
for round in 1 2 3; do for s in 1 4 8; do
  timeout 120 $H 127.0.0.1 7592 --mem staged --transport tcp --size 1GiB --streams $s --iters 5 --timeout 60 --json > "$OUT/r$round-s$s.json" 2> "$OUT/r$round-s$s.err" || echo "failed r$round s$s"
  python3 -c "import json;d=json.load(open('$OUT/r$round-s$s.json'));print('round $round streams $s', [round(i['round_trip_seconds'],3) for i in d['iterations']], [round(i['gb_per_s'],1) for i in d['iterations']])"
done; done
kill $R
grep -c received "$OUT/recv.log"; awk '/received/ {print $(NF-3)}' "$OUT/recv.log" | sort -n | tail -3
