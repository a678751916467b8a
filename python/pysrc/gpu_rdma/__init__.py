"""gpu_rdma: send and receive bytes, NumPy arrays, torch tensors (CPU and CUDA, without a
copy) and files between machines, every chunk checked by CRC32C and sent again if it
fails.

    import gpu_rdma
    listener = gpu_rdma.listen("0.0.0.0:7000")          # receiving machine
    report = listener.recv_into(tensor)                  # lands in place, checked

    endpoint = gpu_rdma.connect("10.0.0.2:7000")         # sending machine
    report = endpoint.send(tensor)                       # returns once verified

    incoming = listener.accept()                         # size unknown beforehand:
    out = torch.empty(incoming.size, dtype=torch.uint8, device="cuda")
    incoming.recv_into(out)                              # sized from the offer

Transfers run over TCP, on as many sockets as the machine and link suggest
(``streams=None``), or over RDMA verbs where this machine has an RDMA device and a route
to the peer (``transport="auto"``, as ``host --transport auto`` chooses; a listener then
serves both). Over verbs, memory lands in host memory (a CUDA tensor is received over
TCP).
Reports are dicts (the JSON the command line prints); failures are exceptions, all
subclasses of ``TransferError``.
"""

from ._native import (
    Cancelled,
    ChecksumFailed,
    Endpoint,
    Handle,
    Incoming,
    Listener,
    PeerGone,
    Rejected,
    TimedOut,
    TransferError,
    Unreachable,
    connect,
    listen,
)

__all__ = [
    "listen",
    "connect",
    "Listener",
    "Endpoint",
    "Handle",
    "Incoming",
    "TransferError",
    "Rejected",
    "ChecksumFailed",
    "TimedOut",
    "PeerGone",
    "Unreachable",
    "Cancelled",
]
