#!/usr/bin/env bash
# Eleventh session, call 4: does --depth (chunks handed to the socket writers and not yet
# written, 16 by default whatever the streams) hold 8 streams back on a busy machine?
# Host to host and GPU to GPU over TCP loopback, 1 GiB, --iters 3, depth 16 / 32 / 64 at
# 8 streams and 16 / 64 at 4, alternated in 3 rounds; the sender's aggregate GB/s.
set -u
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee $OUT/gpu.txt
echo "binaries of $(cat target/dev/commit.txt); $(nproc) cores"
H=target/dev/host; L=$OUT/depth; mkdir -p $L
$H recv --transport tcp --mem device --bind 127.0.0.1 --port 7491 --max-bytes 2GiB --max-memory 64GiB --timeout 60 > $L/recv-device.log 2>&1 & D=$!
$H recv --transport tcp --mem host --bind 127.0.0.1 --port 7492 --max-bytes 2GiB --max-memory 64GiB --timeout 60 > $L/recv-host.log 2>&1 & R=$!
trap 'kill $D $R 2>/dev/null' EXIT
for f in $L/recv-device.log $L/recv-host.log; do for _ in $(seq 300); do grep -q "listening on" $f && break; sleep 0.1; done; done
for round in 1 2 3; do
  for sd in 8:16 8:32 8:64 4:16 4:64; do s=${sd%:*}; d=${sd#*:}
    for kind in host gpu; do
      if [ $kind = gpu ]; then a=(7491 --mem staged); else a=(7492 --gpu none); fi
      o=$L/$kind-$s-$d-$round.json
      timeout 100 $H 127.0.0.1 "${a[@]}" --transport tcp --size 1GiB --streams $s --depth $d --iters 3 --timeout 60 --json > $o 2> $o.err || { echo "FAILED $kind $s $d $round: $(tail -2 $o.err)"; continue; }
      g=$(python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["aggregate"]; print(round(a.get("gb_per_s", a.get("gbps")),2))' $o)
      printf '%s\t%s\t%s\t%s\t%s\n' $round $kind $s $d $g | tee -a $L/results.tsv
    done
  done
done
python3 - $L/results.tsv <<'PY'
import statistics,sys,collections
m=collections.defaultdict(list)
for l in open(sys.argv[1]):
    r,k,s,d,g=l.split(); m[(k,int(s),int(d))].append(float(g))
for key in sorted(m): print(key, "median", statistics.median(m[key]), "runs", m[key])
PY
cd $OUT && tar czf depth.tgz depth && rm -rf depth
