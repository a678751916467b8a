#!/usr/bin/env bash
# Ninth session: GPU to GPU against host to host over TCP loopback at 1 stream, 1 GiB x 3,
# by chunk size (1, 2, 4, 8 MiB), three rounds interleaved: does the staged path's gap at
# one stream depend on the chunk? Then 4 and 8 streams at 1 and 4 MiB, one round.
set -u
name=$(nvidia-smi --query-gpu=name,uuid --format=csv,noheader | head -1)
echo "GPU: $name; binaries of $(cat target/dev/commit.txt)"
B=target/dev/host
L=$OUT/logs; mkdir -p $L
$B recv --transport tcp --mem device --bind 127.0.0.1 --port 7491 --max-bytes 2GiB --max-memory 64GiB --timeout 60 > $L/recv-device.log 2>&1 &
D=$!
$B recv --transport tcp --mem host --bind 127.0.0.1 --port 7492 --max-bytes 2GiB --max-memory 64GiB --timeout 60 > $L/recv-host.log 2>&1 &
H=$!
trap 'kill $D $H 2>/dev/null' EXIT
sleep 2
one() { # kind streams chunk round
  local args
  if [ "$1" = gpu ]; then args="7491 --mem staged"; else args="7492 --gpu none"; fi
  timeout 60 $B 127.0.0.1 $args --transport tcp --size 1GiB --streams $2 --chunk $3 --iters 3 --timeout 60 --json > $L/$1-$2-$3-$4.json 2> $L/$1-$2-$3-$4.err
  python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["aggregate"]; print(round(a["gb_per_s"],3))' $L/$1-$2-$3-$4.json 2>/dev/null || echo fail
}
echo "streams chunk round gpu host ratio"
for r in 1 2 3; do for c in 1MiB 2MiB 4MiB 8MiB; do
  g=$(one gpu 1 $c $r); h=$(one host 1 $c $r)
  echo "1 $c $r $g $h $(python3 -c "print(round($g/$h,3))" 2>/dev/null)"
done; done
for s in 4 8; do for c in 1MiB 4MiB; do
  g=$(one gpu $s $c 1); h=$(one host $s $c 1)
  echo "$s $c 1 $g $h $(python3 -c "print(round($g/$h,3))" 2>/dev/null)"
done; done
cd $OUT && tar czf logs.tgz logs --remove-files
