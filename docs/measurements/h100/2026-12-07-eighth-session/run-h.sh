#!/usr/bin/env bash
# Eighth session, call 1: the A/B of plugin builds at NCCL's defaults (run-ab.sh), then host bench tcp at 1/4/8 streams.
set -u
bash target/dev/run-ab.sh
mkdir -p $OUT/bench
for s in 1 4 8; do timeout 60 target/dev/host bench tcp --size 1GiB --streams $s --rounds 3 > $OUT/bench/bench-tcp-$s.json 2> $OUT/bench/bench-tcp-$s.err; echo "bench tcp $s rc=$?"; tail -c 400 $OUT/bench/bench-tcp-$s.json; echo; done
cd $OUT && tar czf bench.tgz bench && rm -rf bench
