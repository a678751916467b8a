"""gpu_rdma with torch's CUDA tensors: in place (no copy into another tensor), across two
processes, ordered after the producer's streams, faults repaired into GPU memory.

Runs where torch sees a CUDA GPU (the H200 of docs/measurements/h200/); elsewhere each
test is skipped with the reason (no torch, or torch without a GPU)."""

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the CUDA tests need it)")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

import gpu_rdma  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20


def seeded(n, seed, device="cuda"):
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device=device, generator=g)


RECEIVER = textwrap.dedent(
    r"""
    import json, sys, time, torch, gpu_rdma
    n, seed = int(sys.argv[1]), int(sys.argv[2])
    target = torch.empty(n, dtype=torch.uint8, device="cuda")
    ptr = target.data_ptr()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    peak0 = torch.cuda.max_memory_allocated()
    free0 = torch.cuda.mem_get_info()[0]
    listener = gpu_rdma.listen("127.0.0.1:0", timeout=60, wait=120, max_bytes=n)
    print(listener.port, flush=True)
    t0 = time.monotonic()
    report = listener.recv_into(target)
    seconds = time.monotonic() - t0
    free1 = torch.cuda.mem_get_info()[0]
    peak1 = torch.cuda.max_memory_allocated()
    g = torch.Generator(device="cuda"); g.manual_seed(seed)
    expected = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=g)
    print(json.dumps({
        "equal": bool(torch.equal(target, expected)),
        "same_ptr": target.data_ptr() == ptr,
        "peak_growth": peak1 - peak0,
        "free_drop": free0 - free1,
        "seconds": seconds,
        "repaired": len(report["integrity"]["repaired"]),
        "path": report["path"],
    }), flush=True)
    """
)


def receiver_process(n, seed):
    child = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, str(n), str(seed)],
        stdout=subprocess.PIPE,
        text=True,
    )
    port = int(child.stdout.readline())
    return child, port


def test_a_1_gib_cuda_tensor_lands_in_a_preallocated_cuda_tensor_of_another_process():
    n = GIB
    # The sender's tensor first: both processes share one GPU here, and the receiver's
    # free-memory reading (device-wide) must not count the sender's allocations.
    sent = seeded(n, 11)
    torch.cuda.synchronize()
    child, port = receiver_process(n, 11)
    try:
        torch.cuda.reset_peak_memory_stats()
        peak0 = torch.cuda.max_memory_allocated()
        report = gpu_rdma.connect(f"127.0.0.1:{port}", streams=8, timeout=60).send(sent)
        peak_growth = torch.cuda.max_memory_allocated() - peak0
        out, _ = child.communicate(timeout=180)
    finally:
        if child.poll() is None:
            child.kill()
    got = json.loads(out.strip().splitlines()[-1])
    print("sender:", json.dumps(report), "receiver:", json.dumps(got))
    assert report["receiver"]["status"] == "verified"
    assert got["equal"], "the received tensor differs (torch.equal on the GPU)"
    assert got["same_ptr"], "the data did not land in the caller's tensor"
    # No copy into another tensor on either end: torch's allocator gave nothing more
    # (the staging rings are page-locked host memory, not the GPU's).
    assert got["peak_growth"] < n // 16, got
    assert peak_growth < n // 16, peak_growth
    assert got["free_drop"] < n // 4, got


def test_a_tensor_written_on_a_side_stream_just_before_send_arrives_as_written_20_times():
    n = 64 * MIB
    listener = gpu_rdma.listen("127.0.0.1:0", timeout=30, wait=60)
    endpoint = gpu_rdma.connect(listener.address, streams=4, timeout=30)
    side = torch.cuda.Stream()
    x = torch.zeros(n, dtype=torch.uint8, device="cuda")
    y = torch.empty(n, dtype=torch.uint8, device="cuda")
    for i in range(20):
        receiving = listener.recv_into_async(y)
        with torch.cuda.stream(side):
            # A long kernel first, then the write: a send that did not wait for this
            # stream would read the old bytes.
            torch.cuda._sleep(50_000_000)
            x.fill_(i + 1)
            report = endpoint.send(x)
        receiving.wait(timeout=60)
        assert report["receiver"]["status"] == "verified"
        # Read on the receiver's current stream, right after recv_into returned.
        assert torch.equal(y, torch.full_like(y, i + 1)), f"round {i}"


def test_injected_faults_are_repaired_into_gpu_memory():
    n = 64 * MIB + 3
    sent = seeded(n, 5)
    target = torch.zeros(n, dtype=torch.uint8, device="cuda")
    listener = gpu_rdma.listen("127.0.0.1:0", timeout=30, wait=60)
    box = {}
    t = threading.Thread(target=lambda: box.update(r=listener.recv_into(target)))
    t.start()
    report = gpu_rdma.connect(
        listener.address, streams=4, test_inject_faults="1/3", max_resends=8
    ).send(sent)
    t.join(120)
    assert report["receiver"]["status"] == "verified"
    assert torch.equal(target, sent)
    assert box["r"]["integrity"]["repaired"], "nothing was repaired"


def test_accept_sizes_a_cuda_tensor_from_the_offer_and_it_lands_there():
    n = 16 * MIB + 5
    sent = seeded(n, 9)
    listener = gpu_rdma.listen("127.0.0.1:0", timeout=30, wait=60)
    box = {}

    def receive():
        incoming = listener.accept()
        out = torch.empty(incoming.size, dtype=torch.uint8, device="cuda")
        box["ptr"] = out.data_ptr()
        box["report"] = incoming.recv_into(out)
        box["out"] = out

    t = threading.Thread(target=receive)
    t.start()
    gpu_rdma.connect(listener.address, streams=4).send(sent, name="sized")
    t.join(120)
    assert box["out"].data_ptr() == box["ptr"]
    assert torch.equal(box["out"], sent)
    assert box["report"]["integrity"]["name"] == "sized"


def test_small_cuda_tensors_fit_a_listener_sized_for_them():
    # A listener's max_bytes of exactly the tensor's size: its limit has room for the
    # upload ring (4 MiB a stream at 1 MiB chunks), which a 1 MiB tensor's data alone
    # did not (refused: "4 MiB more would put its buffers over its --max-memory 2 MiB").
    for n, streams in [(1, 1), (MIB, 1), (MIB, 8), (4 * MIB + 1, 4)]:
        sent = seeded(n, n)
        target = torch.zeros(n, dtype=torch.uint8, device="cuda")
        listener = gpu_rdma.listen("127.0.0.1:0", timeout=30, wait=60, max_bytes=n)
        box = {}
        t = threading.Thread(target=lambda: box.update(r=listener.recv_into(target)))
        t.start()
        report = gpu_rdma.connect(listener.address, streams=streams).send(sent)
        t.join(60)
        assert report["receiver"]["status"] == "verified", (n, streams)
        assert torch.equal(target, sent), (n, streams)


def test_cpu_tensors_go_through_dlpack_in_place():
    sent = seeded(3 * MIB + 1, 2, device="cpu")
    target = torch.zeros_like(sent)
    listener = gpu_rdma.listen("127.0.0.1:0", timeout=30, wait=60)
    box = {}
    t = threading.Thread(target=lambda: box.update(r=listener.recv_into(target)))
    t.start()
    gpu_rdma.connect(listener.address).send(sent)
    t.join(60)
    assert torch.equal(target, sent)


def test_a_non_contiguous_cuda_tensor_is_refused():
    x = torch.zeros((64, 64), dtype=torch.float32, device="cuda").t()
    with pytest.raises(ValueError, match="contiguous"):
        gpu_rdma.connect("127.0.0.1:9").send(x)


def test_a_cuda_tensor_being_received_into_is_no_other_transfers_meanwhile():
    # The claim on memory a receive writes holds for GPU memory too: a second receive
    # into an overlapping slice (another listener) or a send of it is a BufferError.
    # Then the receive lands as sent.
    target = torch.zeros(MIB, dtype=torch.uint8, device="cuda")
    first = gpu_rdma.listen("127.0.0.1:0", timeout=30, wait=60)
    second = gpu_rdma.listen("127.0.0.1:0", timeout=30, wait=60)
    receiving = first.recv_into_async(target)
    with pytest.raises(BufferError, match="another transfer is receiving"):
        second.recv_into_async(target[MIB // 2 :])
    with pytest.raises(BufferError, match="a receive is writing"):
        gpu_rdma.connect(second.address).send(target[:16])
    sent = seeded(MIB, 5)
    gpu_rdma.connect(first.address).send(sent)
    receiving.wait(60)
    assert torch.equal(target, sent)
