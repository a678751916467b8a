"""Markers of the Python tests (see test_transfer.py's docstring)."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "tcp_only: needs TCP by name or a TCP relay; deselected where the tests run over "
        "RDMA verbs (python/tests/softroce-run.sh)",
    )
