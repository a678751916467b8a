#!/usr/bin/env bash
# The Python bench again (a second sample on this machine), then the "no slower" figures:
# GPU to GPU against host to host over TCP at 1/4/8 streams (2 rounds), host bench tcp.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt
WHEELS=target/dev/wheels HOST_BIN=target/dev/host OUT=$OUT/python timeout 200 bash python/tests/h200-run.sh > $OUT/python-run.log 2>&1; echo "python rc=$?"
python3 - $OUT/python-run.log <<'PY'
import re,sys
t=open(sys.argv[1]).read()
for k in ("module","cli","cli_checksum_kept_round_trip","nccl_socket","module_over_socket","module_over_cli_same_work"):
    print(k, re.findall(r'"%s": ([0-9.]+)'%k, t))
PY
mkdir -p $OUT/ns
HOST_BIN=target/dev/host LOG=$OUT/ns/scaling timeout 240 tests/gpu-tcp-scaling.sh 2 > $OUT/ns/scaling.json 2> $OUT/ns/scaling.err; echo "scaling rc=$?"
tail -25 $OUT/ns/scaling.json
for s in 1 4 8; do timeout 90 target/dev/host bench tcp --size 1GiB --streams $s --rounds 3 > $OUT/ns/bench-tcp-$s.json 2> $OUT/ns/bench-tcp-$s.err; echo "bench tcp $s rc=$?"; tail -c 400 $OUT/ns/bench-tcp-$s.json; echo; done
cd $OUT && tar czf python.tgz python && rm -rf python && tar czf ns.tgz ns
