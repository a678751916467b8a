#!/usr/bin/env bash
# Eleventh session, call 1 (any GPU; the card is named first): the GPU tests, the endpoint
# example, the outside crate, the Python module's CUDA tests and its bench against the CLI
# and torch.distributed over NCCL's Socket (python/tests/h200-run.sh), then NIXL and
# Mooncake doing the same 1 GiB GPU-to-GPU work (python/bench/peers/) in the same call.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee $OUT/gpu.txt
echo "binaries of $(cat target/dev/commit.txt)"
timeout 100 target/dev/gpu-tests --test-threads 1 > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked" $OUT/gpu-tests.log | head -5; echo "lines saying skip: $(grep -ci skip $OUT/gpu-tests.log)"
timeout 60 target/dev/endpoint 100 > $OUT/endpoint.log 2>&1; echo "endpoint rc=$?"; tail -3 $OUT/endpoint.log
timeout 60 target/dev/outside-crate > $OUT/outside-crate.log 2>&1; echo "outside crate rc=$?"; tail -3 $OUT/outside-crate.log
WHEELS=target/dev/wheels HOST_BIN=target/dev/host OUT=$OUT/python timeout 240 bash python/tests/h200-run.sh > $OUT/python-run.log 2>&1; echo "python rc=$?"
grep -E "passed|failed" $OUT/python-run.log | tail -2
python3 - $OUT/python-run.log <<'PY'
import re,sys
t=open(sys.argv[1]).read()
for k in ("module","cli","nccl_socket","module_over_socket","module_over_cli_same_work"):
    print(k, re.findall(r'"%s": ([0-9.]+)'%k, t))
PY
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/peers .whl/*.whl; echo "peer wheels rc=$?"
PYTHONPATH=/tmp/peers timeout 150 python3 python/bench/peers/nixl_bench.py --size 1GiB --iters 5 > $OUT/nixl.json 2> $OUT/nixl.err; echo "nixl rc=$?"; tail -c 600 $OUT/nixl.json; tail -2 $OUT/nixl.err
PYTHONPATH=/tmp/peers timeout 150 python3 python/bench/peers/mooncake_bench.py --size 1GiB --iters 5 --io-threads 8 > $OUT/mooncake-t8.json 2> $OUT/mooncake-t8.err; echo "mooncake rc=$?"; tail -c 600 $OUT/mooncake-t8.json; tail -2 $OUT/mooncake-t8.err
cd $OUT && tar czf python.tgz python && rm -rf python; ls
