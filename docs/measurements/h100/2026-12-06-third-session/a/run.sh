#!/usr/bin/env bash
# Session 3 (2026-12-06 evening), call 1: GPU tests, the outside crate from GPU memory,
# the library endpoint example, the Python module's CUDA tests and bench (against the
# CLI and NCCL Socket), the "no slower" figures.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > $OUT/gpu.txt; cat $OUT/gpu.txt; nproc
echo "== gpu tests"; t0=$(date +%s)
timeout 200 target/dev/gpu-tests --test-threads 1 > $OUT/gpu-tests.log 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s"
grep -E "^test result|FAILED|panicked|SKIPPED" $OUT/gpu-tests.log | head -10
echo "== outside crate"; timeout 60 target/dev/outside-crate > $OUT/outside-crate.log 2>&1; echo "rc=$?"; cat $OUT/outside-crate.log
echo "== endpoint"; timeout 90 target/dev/endpoint 100 > $OUT/endpoint.log 2>&1; echo "rc=$?"; tail -3 $OUT/endpoint.log
echo "== python"; t0=$(date +%s)
WHEELS=target/dev/wheels HOST_BIN=target/dev/host OUT=$OUT/python timeout 300 bash python/tests/h200-run.sh > $OUT/python-run.log 2>&1; echo "python rc=$? $(( $(date +%s)-t0 ))s"
grep -E "passed|failed" $OUT/python-run.log | tail -3
python3 - $OUT/python-run.log <<'PY'
import re,sys
t=open(sys.argv[1]).read()
for k in ("module","cli","cli_checksum_kept_round_trip","nccl_socket","module_over_socket","module_over_cli_same_work"):
    print(k, re.findall(r'"%s": ([0-9.]+)'%k, t))
PY
mkdir -p $OUT/ns; t0=$(date +%s)
HOST_BIN=target/dev/host LOG=$OUT/ns/scaling timeout 150 tests/gpu-tcp-scaling.sh 2 > $OUT/ns/scaling.json 2> $OUT/ns/scaling.err; echo "scaling rc=$? $(( $(date +%s)-t0 ))s"
tail -22 $OUT/ns/scaling.json
for s in 1 4 8; do timeout 60 target/dev/host bench tcp --size 1GiB --streams $s --rounds 5 > $OUT/ns/bench-tcp-$s.json 2> $OUT/ns/bench-tcp-$s.err; echo "bench tcp $s rc=$?"; grep -E '"(median_gb_per_s|ratio_of_medians)"' $OUT/ns/bench-tcp-$s.json; done
cd $OUT && tar czf python.tgz python && rm -rf python && tar czf ns.tgz ns && rm -rf ns
