# The command of call 8 (on the warm machine of call 7), as sent:
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo; P=$PWD/target/dev/plugin; for r in 1 2; do for v in before:before.so after:libnccl-net-grdma.so; do l=${v%%:*}; so=${v#*:}; env NCCL_NET_PLUGIN=$P/$so NCCL_NET=grdma NCCL_GRDMA_TEST_INJECT_FAULTS=3 timeout 120 python3 tests/nccl/torch_bench.py --label $l-$r --out $OUT/$l-$r.json --ops all_reduce,all_gather,broadcast,send_recv --min-bytes 1KiB --max-bytes 256KiB > $OUT/$l-$r.log 2>&1; echo "$l-$r rc=$? mismatches=$(grep -c MISMATCH $OUT/$l-$r.log) exact=$(grep -c ' exact$' $OUT/$l-$r.log) resent=$(grep -o 'finalized: sent [0-9]* messages, [0-9]* bytes, [0-9]* pieces' $OUT/$l-$r.log | head -1)"; grep MISMATCH $OUT/$l-$r.log | head -3; done; done; cd $OUT && tar czf f3.tgz *.log *.json && rm -f *.log *.json
# What it printed:
# before-1 rc=1 mismatches=2 exact=18 resent=
#         before-1 all_reduce        1024 B    0.000 GB/s MISMATCH
#         before-1 all_reduce       16384 B    0.003 GB/s MISMATCH
# after-1 rc=0 mismatches=0 exact=20 resent=
# before-2 rc=1 mismatches=3 exact=17 resent=
#         before-2 all_reduce        1024 B    0.000 GB/s MISMATCH
#         before-2  broadcast        1024 B    0.005 GB/s MISMATCH
#         before-2 all_gather        4096 B    0.004 GB/s MISMATCH
# after-2 rc=0 mismatches=0 exact=20 resent=
# (resent is empty: NCCL_DEBUG was not set, so the plugin's counters were not logged)
