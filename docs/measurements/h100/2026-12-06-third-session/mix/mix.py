# Which end makes the module slower than the CLI: module sender -> CLI receiver, and CLI
# sender -> module receiver, 1 GiB CUDA, 8 and 4 streams, 5 transfers each; data seconds.
import json, subprocess, sys, time, os, statistics
import torch, gpu_rdma
HOST = sys.argv[1]; OUT = sys.argv[2]
n = 1 << 30
data = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
res = {}
for s in (8, 4):
    # module sender -> CLI receiver
    log = open(f"{OUT}/mix-cli-recv-{s}.log", "w")
    r = subprocess.Popen([HOST, "recv", "--transport", "tcp", "--mem", "device", "--bind", "127.0.0.1", "--port", "7593",
                          "--max-bytes", "2GiB", "--max-memory", "64GiB", "--timeout", "60"], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(300):
        if "listening on" in open(f"{OUT}/mix-cli-recv-{s}.log").read(): break
        time.sleep(0.1)
    ep = gpu_rdma.connect("127.0.0.1:7593", streams=s, timeout=60)
    ph = []
    for _ in range(5):
        t0 = time.perf_counter(); rep = ep.send(data); w = time.perf_counter() - t0
        ph.append((round(w, 4), round(rep["seconds"], 4), round(rep["round_trip_seconds"], 4)))
    del ep
    r.terminate(); r.wait(10)
    res[f"module_send_cli_recv_{s}"] = ph
    # CLI sender -> module receiver
    lst = gpu_rdma.listen("127.0.0.1:0", timeout=60, wait=120, max_bytes=n)
    target = torch.empty(n, dtype=torch.uint8, device="cuda")
    import threading
    reps = []
    def rx():
        for _ in range(5): reps.append(lst.recv_into(target))
    t = threading.Thread(target=rx); t.start()
    out = subprocess.run([HOST, "127.0.0.1", str(lst.port), "--mem", "staged", "--transport", "tcp", "--size", "1GiB",
                          "--streams", str(s), "--iters", "5", "--reuse-connection", "--verify", "checksum", "--timeout", "60", "--json"],
                         capture_output=True, text=True, timeout=120)
    t.join(60)
    try:
        its = json.loads(out.stdout)["iterations"]
        res[f"cli_send_module_recv_{s}"] = [(round(i["seconds"], 4), round(i["round_trip_seconds"], 4)) for i in its]
    except Exception as e:
        res[f"cli_send_module_recv_{s}"] = f"failed: {e} {out.stderr[-300:]}"
print(json.dumps(res, indent=1))
