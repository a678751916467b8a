"""Type stubs of gpu_rdma's native module (python/src/lib.rs)."""

import os
from typing import Any, Literal, Optional, Union, overload

Report = dict[str, Any]
"""A transfer's report: the JSON the command line prints (``host --json``), as a dict."""

Sendable = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", Any]
"""bytes, any buffer-protocol object (NumPy arrays), an object with ``__dlpack__`` or
``__cuda_array_interface__`` (torch tensors on the CPU or a CUDA GPU), or a file path."""

class TransferError(Exception):
    """A transfer failed; the subclass says how, the message what happened."""

class Rejected(TransferError):
    """The peer refused the transfer before any data: too large, the wrong size for the
    buffer it receives into, busy, not allowed, or a key that did not match."""

class ChecksumFailed(TransferError):
    """Chunks still failed their CRC32C after every resend allowed (``max_resends``)."""

class TimedOut(TransferError):
    """A wait ran out: nothing moved for ``timeout``, a sender below ``min_rate``, or no
    transfer within a receive's ``timeout``."""

class PeerGone(TransferError):
    """The peer closed or reset the connection before the transfer ended."""

class Unreachable(TransferError):
    """Nobody accepts connections at the address."""

class Cancelled(TransferError):
    """The caller cancelled the transfer (``Handle.cancel()``); Ctrl-C cancels it too and
    raises KeyboardInterrupt."""

class Handle:
    """A transfer in progress (``send_async``, ``recv_into_async``). The memory it uses
    stays held until it ends, whatever happens to the handle. A handle dropped before
    its transfer ended (garbage-collected) cancels it: keep it until ``wait``."""

    def done(self) -> bool:
        """Whether the transfer has ended (never waits)."""
    def cancel(self) -> None:
        """Stop the transfer: it ends within a moment (the connection broken off, the
        peer told nothing) unless it ended already; ``wait`` then raises Cancelled. Never
        waits."""
    def wait(self, timeout: Optional[float] = None) -> Report:
        """Wait for the end (at most ``timeout`` seconds; None, or a wait longer than the
        clock counts such as ``math.inf``: until it ends) and return the report; raise the
        transfer's exception, or TimedOut if ``timeout`` passed first (the transfer goes
        on: wait again). Ctrl-C cancels the transfer, waits for it to end (a moment; its
        memory is then free) and raises KeyboardInterrupt."""
    @property
    def report(self) -> Optional[Report]:
        """The report once the transfer has ended well; None while it runs."""

class Listener:
    """A bound TCP receiver. Each ``recv``/``recv_into`` takes one transfer."""

    @property
    def address(self) -> str:
        """The bound address, "host:port"."""
    @property
    def port(self) -> int: ...
    @overload
    def recv(self, timeout: Optional[float] = None, report: Literal[False] = False) -> bytes: ...
    @overload
    def recv(self, timeout: Optional[float] = None, *, report: Literal[True]) -> tuple[bytes, Report]: ...
    def recv(self, timeout: Optional[float] = None, report: bool = False) -> Union[bytes, tuple[bytes, Report]]:
        """Receive one transfer and return its bytes (``report=True``: the bytes and the
        report, whose ``integrity["name"]`` is the sender's name). ``timeout``: seconds to
        wait for a sender (None: the listener's ``wait``; by default as long as none
        comes)."""
    def recv_into(self, target: Any, timeout: Optional[float] = None) -> Report:
        """Receive one transfer in place into ``target`` (a writable buffer, NumPy array,
        or torch tensor on the CPU or a CUDA GPU: no copy). Only a transfer of exactly
        ``target``'s size in bytes is taken; any other sender gets Rejected before a
        byte lands, and the receive goes on waiting."""
    def recv_into_async(self, target: Any, timeout: Optional[float] = None) -> Handle:
        """``recv_into`` that returns a Handle at once."""
    def accept(self, timeout: Optional[float] = None) -> Incoming:
        """Wait for the next sender's offer (``timeout``: seconds to wait for one) and
        return it before anything is allocated for it: its ``size``, ``name`` and
        ``peer``. Take it with ``recv()``/``recv_into(target)`` or refuse it with
        ``decline()`` within the listener's ``timeout``."""

class Incoming:
    """An offer waiting for its receiver's decision (from ``Listener.accept``). Dropped
    undecided, or not taken within the listener's ``timeout``, it is declined: the
    sender gets Rejected."""

    @property
    def peer(self) -> str:
        """The sender's "host:port"."""
    @property
    def size(self) -> int:
        """The transfer's size in bytes: a ``recv_into`` target holds exactly this."""
    @property
    def chunk(self) -> int:
        """The sender's chunk size in bytes (one CRC32C each)."""
    @property
    def name(self) -> Optional[str]:
        """The sender's name for the transfer, where it comes with the offer (over TCP).
        Over RDMA verbs it follows the accept: None here, and the receive's report has
        it (``integrity["name"]``)."""
    @overload
    def recv(self, report: Literal[False] = False) -> bytes: ...
    @overload
    def recv(self, *, report: Literal[True]) -> tuple[bytes, Report]: ...
    def recv(self, report: bool = False) -> Union[bytes, tuple[bytes, Report]]:
        """Take the transfer and return its bytes (``report=True``: with the report)."""
    def recv_into(self, target: Any) -> Report:
        """Take the transfer in place into ``target`` of exactly ``size`` bytes (a
        writable buffer, NumPy array, torch tensor on the CPU or a CUDA GPU). A target of
        another size raises ValueError and leaves the offer undecided."""
    def recv_into_async(self, target: Any) -> Handle:
        """``recv_into`` that returns a Handle at once."""
    def decline(self) -> None:
        """Refuse the transfer: its sender gets Rejected ("declined")."""

class Endpoint:
    """A peer to send to, and the options every send to it uses. Each send opens its own
    connection and returns once the receiver has verified every chunk."""

    @property
    def address(self) -> str: ...
    @property
    def streams(self) -> int:
        """Sockets per transfer."""
    def send(self, obj: Sendable, name: Optional[str] = None) -> Report:
        """Send ``obj`` (read in place) or the file at a path; the report once verified."""
    def send_async(self, obj: Sendable, name: Optional[str] = None) -> Handle:
        """``send`` that returns a Handle at once."""

def listen(
    address: str = "127.0.0.1:0",
    *,
    timeout: float = 10.0,
    wait: Optional[float] = None,
    max_bytes: int = 1 << 30,
    min_rate: int = 1 << 20,
    key_file: Optional[Union[str, "os.PathLike[str]"]] = None,
) -> Listener:
    """Listen on ``address`` (port 0 picks a free one). ``timeout`` bounds every wait once
    a sender has come; ``wait`` how long a receive waits for one (None: as long as none
    comes); each given in seconds, at most 86400 (a day, as the command line's
    ``--timeout``; a receive's own ``timeout`` too); ``max_bytes`` the largest ``recv``; ``min_rate`` (bytes/s) the slowest
    sender served; ``key_file``: serve only senders with the same key."""

def connect(
    address: str,
    *,
    transport: str = "auto",
    streams: Optional[int] = None,
    key_file: Optional[Union[str, "os.PathLike[str]"]] = None,
    chunk: int = 1 << 20,
    timeout: float = 10.0,
    max_resends: int = 16,
    test_inject_faults: Optional[str] = None,
) -> Endpoint:
    """An endpoint for the receiver at ``address``. ``transport``: "auto" (RDMA verbs
    where this machine has an RDMA device and a route to the peer, else TCP), "tcp" or
    "rdma"; ``timeout``: seconds, at most 86400, that any wait of a send may last
    (nothing moving, no answer); ``streams``: sockets per transfer (None: chosen from
    this machine's cores and the link, as ``host --streams auto``); ``chunk``: bytes per
    CRC32C; ``max_resends``: the most rounds of resends of chunks that failed (failed
    chunks come again in pieces while the rounds repair something);
    ``test_inject_faults="1/N"`` (tests only) flips a bit in one chunk in N after its
    CRC32C, so the repair is seen to work."""
