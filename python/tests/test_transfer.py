"""gpu_rdma as a user calls it: real sockets or queue pairs, a real receiver, every byte
compared. Each test bounds its waits (the receives' timeouts), so none can hang.

Over TCP loopback by default. `python/tests/softroce-run.sh` runs the same file inside a
Soft-RoCE guest over RDMA verbs: GPU_RDMA_TEST_HOST is then the guest's rxe address and
GPU_RDMA_TEST_TRANSPORT "rdma", and the tests marked `tcp_only` (a TCP relay between the
ends, a TCP-only option) are deselected there."""

import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import gpu_rdma

MIB = 1 << 20

# Where the listeners bind and which transport every endpoint asks for.
HOST = os.environ.get("GPU_RDMA_TEST_HOST", "127.0.0.1")
TRANSPORT = os.environ.get("GPU_RDMA_TEST_TRANSPORT", "auto")
OVER_VERBS = TRANSPORT == "rdma"


def listen(**options):
    """A listener on HOST, on a free port."""
    return gpu_rdma.listen(f"{HOST}:0", **options)


def connect(address, **options):
    """An endpoint over TRANSPORT unless the test names one."""
    options.setdefault("transport", TRANSPORT)
    return gpu_rdma.connect(address, **options)


def receive_in_thread(fn):
    """Run a receive on a thread; join() gives its result or raises its exception."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the test's thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def join(timeout=60):
        t.join(timeout)
        assert not t.is_alive(), "the receive did not end"
        if "error" in box:
            raise box["error"]
        return box["value"]

    return join


def pattern(n, seed=0):
    """Bytes that say where they are (a shifted or stale chunk shows)."""
    out = np.empty(n, dtype=np.uint8)
    # In blocks: the index arithmetic is 64-bit, and 256 MiB of it at once would take
    # 2 GiB (more than a test guest has).
    for start in range(0, n, 1 << 24):
        i = np.arange(start, min(n, start + (1 << 24)), dtype=np.uint64)
        out[start : start + len(i)] = ((i * 2654435761 + seed) >> 8).astype(np.uint8)
    return out


@pytest.fixture
def listener():
    return listen(timeout=10.0, wait=20.0)


DTYPES = [
    np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
    np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_arrays_of_every_dtype_land_exactly_in_place(listener, dtype):
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=3 * 4099 * np.dtype(dtype).itemsize, dtype=np.uint8)
    sent = raw.view(dtype).reshape(3, 4099)
    target = np.zeros_like(sent)
    at = target.ctypes.data
    join = receive_in_thread(lambda: listener.recv_into(target))
    report = connect(listener.address).send(sent)
    got = join()
    assert target.ctypes.data == at
    assert target.tobytes() == sent.tobytes()
    assert report["receiver"]["status"] == "verified"
    assert got["bytes"] == sent.nbytes
    assert got["integrity"]["chunks_checked"] >= 1


@pytest.mark.parametrize("size", [1, 3, 4096, MIB + 3, 256 * MIB + 3], ids=str)
def test_sizes_from_one_byte_to_256_mib_and_3(listener, size):
    sent = pattern(size, size)
    target = np.empty(size, dtype=np.uint8)
    join = receive_in_thread(lambda: listener.recv_into(target))
    connect(listener.address, streams=2).send(sent)
    join()
    assert np.array_equal(target, sent)


def test_bytes_bytearray_and_memoryviews_go_as_they_are(listener):
    data = bytes(pattern(100_003, 1))
    for obj in [data, bytearray(data), memoryview(data), memoryview(bytearray(data))[7:]]:
        join = receive_in_thread(lambda: listener.recv())
        connect(listener.address).send(obj)
        assert join() == bytes(obj)


def test_recv_can_give_the_report_with_the_bytes(listener):
    join = receive_in_thread(lambda: listener.recv(report=True))
    connect(listener.address).send(b"named bytes", name="n.bin")
    data, report = join()
    assert data == b"named bytes"
    assert report["integrity"]["name"] == "n.bin"
    assert report["bytes"] == len(data)


def test_a_file_goes_with_its_name(listener, tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(pattern(3 * MIB + 1, 5)))
    target = bytearray(path.stat().st_size)
    join = receive_in_thread(lambda: listener.recv_into(target))
    connect(listener.address).send(path)
    report = join()
    assert bytes(target) == path.read_bytes()
    assert report["integrity"]["name"] == "weights.bin"
    # A str path too, named as asked.
    join = receive_in_thread(lambda: listener.recv_into(target))
    connect(listener.address).send(str(path), name="other.bin")
    assert join()["integrity"]["name"] == "other.bin"


def test_recv_into_allocates_nothing_of_the_datas_size(listener):
    size = 256 * MIB
    sent = pattern(size, 9)
    target = np.ones(size, dtype=np.uint8)  # touched: its pages are resident already
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, the peak
    join = receive_in_thread(lambda: listener.recv_into(target))
    connect(listener.address, streams=2).send(sent)
    join()
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert np.array_equal(target, sent)
    # A copy through a buffer of the data's size would raise the peak by 256 MiB.
    assert grown_kib < 32 * 1024, f"the peak grew by {grown_kib} KiB"


def test_a_target_of_another_size_is_refused_before_a_byte_lands():
    listener = listen(wait=1.5)
    target = np.full(1000, 0xAB, dtype=np.uint8)
    join = receive_in_thread(lambda: listener.recv_into(target))
    endpoint = connect(listener.address)
    for n in (1001, 999):
        with pytest.raises(gpu_rdma.Rejected, match="exactly 1000 bytes"):
            endpoint.send(pattern(n))
    # The timeout says a sender came and why it was refused, not only that none arrived.
    with pytest.raises(gpu_rdma.TimedOut, match=r"the last offer, from .* was refused: .*exactly 1000 bytes"):
        join()
    assert (target == 0xAB).all()


def test_an_offer_over_max_bytes_is_rejected():
    listener = listen(wait=1.5, max_bytes=1000)
    join = receive_in_thread(lambda: listener.recv())
    with pytest.raises(gpu_rdma.Rejected, match="max-bytes"):
        connect(listener.address).send(pattern(1001))
    with pytest.raises(gpu_rdma.TimedOut):
        join()


def test_a_wrong_key_is_rejected(tmp_path):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.write_bytes(b"k" * 32)
    theirs.write_bytes(b"x" * 32)
    listener = listen(wait=1.5, key_file=mine)
    join = receive_in_thread(lambda: listener.recv())
    with pytest.raises(gpu_rdma.Rejected, match="key"):
        connect(listener.address, key_file=theirs).send(b"secret")
    with pytest.raises(gpu_rdma.TimedOut):
        join()
    # The right key goes through.
    join = receive_in_thread(lambda: listener.recv())
    connect(listener.address, key_file=mine).send(b"secret")
    assert join() == b"secret"


def test_injected_faults_are_repaired_and_the_bytes_exact(listener):
    sent = pattern(8 * MIB + 5, 3)
    target = np.zeros_like(sent)
    join = receive_in_thread(lambda: listener.recv_into(target))
    report = connect(
        listener.address, chunk=64 << 10, test_inject_faults="1/3", max_resends=8
    ).send(sent)
    got = join()
    assert np.array_equal(target, sent)
    assert got["integrity"]["repaired"], "nothing was repaired"
    assert report["receiver"]["status"] == "verified"


def test_faults_on_every_chunk_give_checksum_failed():
    listener = listen(wait=10)
    target = np.zeros(1 * MIB, dtype=np.uint8)
    join = receive_in_thread(lambda: listener.recv_into(target))
    with pytest.raises(gpu_rdma.ChecksumFailed):
        connect(listener.address, test_inject_faults="1/1", max_resends=1).send(
            pattern(MIB)
        )
    with pytest.raises(gpu_rdma.ChecksumFailed):
        join()


def test_a_receive_with_no_sender_times_out(listener):
    t0 = time.monotonic()
    with pytest.raises(gpu_rdma.TimedOut, match="no transfer arrived"):
        listener.recv(timeout=0.5)
    assert time.monotonic() - t0 < 5


def test_nobody_listening_is_unreachable():
    s = socket.socket()
    s.bind((HOST, 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(gpu_rdma.Unreachable):
        connect(f"{HOST}:{port}").send(b"x")


STALLING_PROXY_SENDER = r"""
import sys, numpy as np, gpu_rdma
port = int(sys.argv[1])
data = np.ones(512 << 20, dtype=np.uint8)
print("sending", flush=True)
gpu_rdma.connect(f"127.0.0.1:{port}", transport="tcp", streams=1, timeout=60).send(data)
"""


def stalling_proxy(target_port, forward_bytes):
    """A loopback relay that forwards `forward_bytes` of the sender's bytes, then stops
    reading (the sender blocks in its writes) and, once the sender is gone (EOF or
    reset), closes the receiver's side: a sender killed half-way, as the receiver sees it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    forwarded = threading.Event()

    def run():
        client, _ = server.accept()
        upstream = socket.create_connection(("127.0.0.1", target_port))

        def back():
            try:
                while (b := upstream.recv(65536)):
                    client.sendall(b)
            except OSError:
                pass

        threading.Thread(target=back, daemon=True).start()
        sent = 0
        while sent < forward_bytes:
            b = client.recv(min(65536, forward_bytes - sent))
            if not b:
                break
            upstream.sendall(b)
            sent += len(b)
        forwarded.set()
        # Wait for the sender to go: a read that ends in EOF or a reset.
        client.settimeout(30)
        try:
            while client.recv(1 << 20):
                pass
        except OSError:
            pass
        # shutdown, not only close: the relay's other thread is blocked reading this
        # socket, and a close alone would keep it open (no FIN) until that read ends.
        for s in (upstream, client):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    threading.Thread(target=run, daemon=True).start()
    return server.getsockname()[1], forwarded


@pytest.mark.tcp_only  # the relay between the ends is a TCP one
def test_a_sender_killed_half_way_gives_peer_gone():
    listener = listen(timeout=20, wait=30)
    target = np.zeros(512 << 20, dtype=np.uint8)
    join = receive_in_thread(lambda: listener.recv_into(target))
    port, forwarded = stalling_proxy(listener.port, 8 * MIB)
    child = subprocess.Popen([sys.executable, "-c", STALLING_PROXY_SENDER, str(port)])
    try:
        assert forwarded.wait(30), "the sender never sent 8 MiB"
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        t0 = time.monotonic()
        with pytest.raises(gpu_rdma.PeerGone):
            join()
        assert time.monotonic() - t0 < 15
    finally:
        if child.poll() is None:
            child.kill()


def test_one_endpoint_carries_a_hundred_transfers(listener):
    endpoint = connect(listener.address)
    sizes = [1000 + 37 * i for i in range(100)]

    def receive_all():
        got = []
        for n in sizes:
            target = np.empty(n, dtype=np.uint8)
            listener.recv_into(target)
            got.append(target)
        return got

    join = receive_in_thread(receive_all)
    for i, n in enumerate(sizes):
        report = endpoint.send(pattern(n, i))
        # Over TCP one connection: opened by the first send, kept for the others. Over
        # verbs each send opens its own (queue pairs and registration per transfer).
        assert report["kept_connection"] == (i > 0 and not OVER_VERBS), f"transfer {i}"
    for i, (n, got) in enumerate(zip(sizes, join(120))):
        assert np.array_equal(got, pattern(n, i)), f"transfer {i}"


def test_async_handles_are_polled_to_their_end(listener):
    sent = pattern(32 * MIB + 1, 4)
    target = np.zeros_like(sent)
    receiving = listener.recv_into_async(target)
    sending = connect(listener.address).send_async(sent)
    polls = 0
    deadline = time.monotonic() + 60
    while not (sending.done() and receiving.done()):
        assert time.monotonic() < deadline
        polls += 1
        time.sleep(0.001)
    assert sending.wait()["receiver"]["status"] == "verified"
    assert receiving.report["bytes"] == sent.nbytes
    assert np.array_equal(target, sent)


def test_a_wait_shorter_than_the_transfer_times_out_and_the_transfer_goes_on(listener):
    target = np.zeros(4, dtype=np.uint8)
    receiving = listener.recv_into_async(target, timeout=10)
    with pytest.raises(gpu_rdma.TimedOut, match="goes on"):
        receiving.wait(timeout=0.05)
    connect(listener.address).send(b"late")
    receiving.wait(timeout=30)
    assert target.tobytes() == b"late"


def test_what_cannot_be_taken_is_refused_with_a_clear_error(listener):
    with pytest.raises(ValueError):
        connect(listener.address).send(np.arange(100, dtype=np.int32)[::2])
    with pytest.raises(BufferError):
        listener.recv_into(b"read-only bytes")
    with pytest.raises(TypeError, match="cannot send or receive"):
        connect(listener.address).send(12345)
    with pytest.raises(ValueError, match="transport"):
        connect(listener.address, transport="carrier-pigeon")
    with pytest.raises(ValueError, match="streams"):
        connect(listener.address, streams=0)
    with pytest.raises(ValueError, match="empty"):
        listener.recv_into(bytearray())
    with pytest.raises(ValueError, match="nothing to transfer"):
        connect(listener.address).send(b"")


def test_waits_out_of_range_are_value_errors_and_an_endless_wait_is_allowed(listener):
    # Before, a timeout past what the clock counts panicked: inside the receive's thread
    # (a TransferError saying only that the thread ended), or across the call
    # (pyo3's PanicException) for Handle.wait(math.inf).
    for bad in (0, -1, float("nan"), float("inf"), 1e19, 86401):
        with pytest.raises(ValueError, match="at most 86400"):
            listen(timeout=bad)
        with pytest.raises(ValueError, match="at most 86400"):
            connect(listener.address, timeout=bad)
        with pytest.raises(ValueError, match="at most 86400"):
            listener.recv(timeout=bad)
    with pytest.raises(ValueError, match="at most 86400"):
        listen(wait=1e19)
    target = np.zeros(4, dtype=np.uint8)
    receiving = listener.recv_into_async(target, timeout=86400)
    with pytest.raises(ValueError, match="not negative"):
        receiving.wait(timeout=-1)
    with pytest.raises(ValueError, match="not negative"):
        receiving.wait(timeout=float("nan"))
    connect(listener.address, timeout=86400).send(b"ends")
    for endless in (float("inf"), 1e300, 1e19):
        assert receiving.wait(timeout=endless)["bytes"] == 4
    assert target.tobytes() == b"ends"


def test_arrays_of_python_objects_are_refused_both_ways(listener):
    # Their bytes are this process's pointers: received into, the array held a peer's
    # bytes as object pointers (a segfault at its next use); sent, the pointers went out.
    objects = np.empty(3, dtype=object)
    with pytest.raises(TypeError, match="Python objects"):
        listener.recv_into(objects, timeout=1)
    with pytest.raises(TypeError, match="Python objects"):
        listener.recv_into(np.zeros(2, dtype=[("n", "i4"), ("o", "O")]), timeout=1)
    with pytest.raises(TypeError, match="Python objects"):
        connect(listener.address).send(np.array([1, "a"], dtype=object))
    assert objects.tolist() == [None, None, None]
    # A field whose name holds an O is a plain value.
    named = np.array([(1,), (2,), (3,)], dtype=[("Ok", "i4")])
    join = receive_in_thread(lambda: listener.recv(timeout=10))
    connect(listener.address).send(named)
    assert join() == named.tobytes()


def test_memory_a_receive_writes_is_no_other_transfers_meanwhile(listener):
    # Two receives into one array (two listeners) landed at once, and a send could read
    # an array a receive was writing; the promise each transfer makes to the library (the
    # memory is its own until it ends) did not hold.
    other = listen(timeout=5)
    target = np.zeros(1024, dtype=np.uint8)
    receiving = listener.recv_into_async(target, timeout=10)
    with pytest.raises(BufferError, match="another transfer is receiving"):
        other.recv_into_async(target[:512], timeout=1)
    with pytest.raises(BufferError, match="a receive is writing"):
        connect(other.address).send(target[256:])
    # Sends share what they read; a receive into what a send reads waits its turn.
    source = np.arange(1024, dtype=np.uint8)
    first = connect(other.address).send_async(source)
    second = connect(other.address).send_async(source)
    with pytest.raises(BufferError, match="a send is reading"):
        listener.recv_into_async(source, timeout=1)
    for _ in range(2):
        assert other.recv(timeout=10) == source.tobytes()
    first.wait(10)
    second.wait(10)
    connect(listener.address).send(source)
    receiving.wait(10)
    assert target.tobytes() == source.tobytes()
    # Once the transfers ended, the memory is free again.
    join = receive_in_thread(lambda: other.recv_into(target, timeout=10))
    connect(other.address).send(source[::-1].copy())
    join()
    assert target.tobytes() == source[::-1].tobytes()


def test_reports_are_plain_dicts_of_what_happened(listener):
    join = receive_in_thread(lambda: listener.recv_into(bytearray(10)))
    sent = connect(listener.address).send(b"0123456789", name="ten")
    got = join()
    assert isinstance(sent, dict) and isinstance(got, dict)
    assert sent["bytes"] == 10 and got["bytes"] == 10
    assert got["integrity"]["name"] == "ten"
    assert got["peer"].startswith(f"{HOST}:")
    # The transport asked for is the one that carried it ("tcp", or a verbs operation).
    assert (sent["op"] == "tcp") == (not OVER_VERBS), sent["op"]


def test_accept_shows_the_offer_before_anything_is_allocated_for_it(listener):
    sizes = [1, 4099, MIB + 3]
    got = []

    def receive_all():
        for k in range(len(sizes)):
            incoming = listener.accept()
            assert incoming.peer.startswith(f"{HOST}:")
            if k % 2 == 0:
                # A target sized from the offer, taken in place.
                target = np.zeros(incoming.size, dtype=np.uint8)
                at = target.ctypes.data
                report = incoming.recv_into(target)
                assert target.ctypes.data == at
                assert report["bytes"] == incoming.size
                # Over verbs the name follows the accept: the report has it.
                assert report["integrity"]["name"] == f"t{k}"
                got.append((incoming.name, target.tobytes()))
            else:
                got.append((incoming.name, incoming.recv()))
            with pytest.raises(RuntimeError, match="taken or declined already"):
                incoming.recv()
        return got

    join = receive_in_thread(receive_all)
    endpoint = connect(listener.address)
    for k, size in enumerate(sizes):
        endpoint.send(pattern(size, k), name=f"t{k}")
    for k, (name, data) in enumerate(join()):
        assert name == (None if OVER_VERBS else f"t{k}")
        assert data == pattern(sizes[k], k).tobytes()


def test_a_declined_offer_and_a_wrong_sized_target_refuse_before_a_byte_lands(listener):
    def receive():
        listener.accept().decline()
        incoming = listener.accept()
        small = np.full(incoming.size - 1, 0xAB, dtype=np.uint8)
        with pytest.raises(ValueError, match="exactly the offer's size"):
            incoming.recv_into(small)
        assert (small == 0xAB).all()
        # Still undecided after the ValueError: taken into the right size.
        return incoming.recv()

    join = receive_in_thread(receive)
    endpoint = connect(listener.address)
    with pytest.raises(gpu_rdma.Rejected, match="declined"):
        endpoint.send(b"not wanted")
    endpoint.send(b"wanted")
    assert join() == b"wanted"


def test_accept_with_no_sender_times_out(listener):
    t0 = time.monotonic()
    with pytest.raises(gpu_rdma.TimedOut):
        listener.accept(timeout=0.3)
    assert time.monotonic() - t0 < 5


def sigint_after(seconds):
    """SIGINT to this process in `seconds`, as Ctrl-C would send it."""
    threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT)).start()


@pytest.fixture
def ctrl_c():
    """Python's own SIGINT handler (KeyboardInterrupt) for the test, whatever the runner
    left: a runner started in the background by a shell inherits SIGINT ignored, and
    Python then installs no handler, so Ctrl-C would do nothing there (seen in a CI run
    started with `&`)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_a_cancelled_receive_raises_cancelled_at_once_and_the_listener_goes_on(listener):
    target = np.zeros(1000, dtype=np.uint8)
    handle = listener.recv_into_async(target)
    time.sleep(0.2)
    t0 = time.monotonic()
    handle.cancel()
    with pytest.raises(gpu_rdma.Cancelled, match="cancelled by the caller"):
        handle.wait(10)
    assert time.monotonic() - t0 < 2
    join = receive_in_thread(lambda: listener.recv_into(target))
    connect(listener.address).send(pattern(1000, 5))
    join()
    assert np.array_equal(target, pattern(1000, 5))


def test_ctrl_c_cancels_a_waiting_receive_and_frees_its_memory(listener, ctrl_c):
    # SIGINT to this process while recv_into waits for a sender (up to 20 s): the
    # receive is cancelled, its thread ends and lets the array go (the buffer it held
    # counted a reference to it), and Python sees KeyboardInterrupt at once.
    target = np.zeros(4096, dtype=np.uint8)
    refs = sys.getrefcount(target)
    sigint_after(0.3)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        listener.recv_into(target)
    assert time.monotonic() - t0 < 3
    assert sys.getrefcount(target) == refs, "the cancelled receive still holds the array"
    # The listener serves the next.
    out = np.zeros(100, dtype=np.uint8)
    join = receive_in_thread(lambda: listener.recv_into(out))
    connect(listener.address).send(pattern(100, 9))
    join()
    assert np.array_equal(out, pattern(100, 9))


@pytest.mark.tcp_only  # asks for TCP by name
def test_ctrl_c_cancels_a_send_waiting_for_its_answer(ctrl_c):
    # A listener in no receive: the send's offer waits for an answer (up to 20 s) until
    # SIGINT, which cancels it and raises KeyboardInterrupt at once.
    quiet = listen(timeout=20.0)
    endpoint = connect(quiet.address, transport="tcp", timeout=20.0)
    data = pattern(1000, 3)
    refs = sys.getrefcount(data)
    sigint_after(0.3)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        endpoint.send(data)
    assert time.monotonic() - t0 < 3
    assert sys.getrefcount(data) == refs, "the cancelled send still holds the array"


def test_a_handle_dropped_before_its_end_cancels_its_receive(listener):
    # A receive's handle garbage-collected undone (here with no wait at all) went on
    # serving: it held its thread, the listener and the array for ever, and took the
    # next sender's transfer into an array nobody looked at.
    forever = listen(timeout=10.0)
    target = np.zeros(5, dtype=np.uint8)
    handle = forever.recv_into_async(target)
    del handle
    time.sleep(0.3)
    # The array is free again: another receive may land in it.
    join = receive_in_thread(lambda: listener.recv_into(target))
    connect(listener.address).send(pattern(5, 3))
    join()
    assert np.array_equal(target, pattern(5, 3))
    # And the dropped receive took nothing: the next sender waits for the next receive.
    sending = receive_in_thread(lambda: connect(forever.address).send(b"hello"))
    time.sleep(0.7)
    assert forever.recv(timeout=10) == b"hello"
    sending()


def test_threads_polling_one_handle_never_deadlock():
    # Handle.take held the handle's lock while json.loads ran, which can let another
    # thread in; that thread's done() or report then waited for the lock holding the GIL,
    # and the process hung. In a child process, so a hang fails the test, not the run.
    script = f"""
import threading, gpu_rdma
l = gpu_rdma.listen("{HOST}:0", wait=20)
h = l.recv_into_async(bytearray(4096))
gpu_rdma.connect(l.address, transport="{TRANSPORT}").send(bytes(4096))
h.wait(20)
def poll():
    for _ in range(20000):
        h.done(); h.report
threads = [threading.Thread(target=poll) for _ in range(4)]
for t in threads: t.start()
for _ in range(20000): h.wait(1)
for t in threads: t.join()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


class DlpackOnly:
    """An object whose memory is reached through DLPack alone (as a torch CPU tensor's
    is), over a NumPy array; `versioned=False` plays a producer older than DLPack 1.0
    (its `__dlpack__` knows no `max_version`)."""

    def __init__(self, array, versioned=True):
        self.array = array
        self.versioned = versioned

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        if not self.versioned:
            if kwargs:
                raise TypeError("__dlpack__() got an unexpected keyword argument")
            return self.array.__dlpack__()
        return self.array.__dlpack__(**kwargs)


def test_dlpack_targets_land_in_place_and_a_read_only_one_is_refused(listener):
    # A receive into a tensor its producer marks read-only (DLPack 1.0's flag) wrote it
    # all the same: the DLPack path never looked.
    frozen = np.zeros(4096, dtype=np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        listener.recv_into(DlpackOnly(frozen))
    # It may still be sent (a send only reads).
    join = receive_in_thread(lambda: listener.recv())
    connect(listener.address).send(DlpackOnly(frozen))
    assert join() == bytes(4096)
    for versioned in (True, False):
        target = np.zeros(1000, dtype=np.uint8)
        join = receive_in_thread(lambda: listener.recv_into(DlpackOnly(target, versioned)))
        connect(listener.address).send(pattern(1000, 9))
        join()
        assert np.array_equal(target, pattern(1000, 9)), f"versioned={versioned}"
