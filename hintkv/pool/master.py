"""Start and stop a local `mooncake_master` (the binary ships in the Mooncake wheel).

    with MooncakeMaster() as m:            # free loopback ports, waits until it answers
        backend = MooncakeBackend(n, master=m.rpc_address, metadata=m.metadata_url)
        m.allocated_bytes()                # the pool's bytes in use (its metrics endpoint)

Everything listens on 127.0.0.1. (On this machine's build the HTTP metadata server was seen on
0.0.0.0 even when told 127.0.0.1: run it where that port is not reachable from outside, or
firewall it.) `hintkv pool start` runs one in the foreground.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Self


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


try:  # resolved here, so that the forked child only makes one C call before exec
    _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL when the process that started it dies, so a
    crashed test run or server never leaves a master behind."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def master_binary() -> str:
    found = shutil.which("mooncake_master") or str(Path(sys.executable).with_name("mooncake_master"))
    if not os.access(found, os.X_OK):
        raise FileNotFoundError("mooncake_master not found: pip install "
                                "mooncake-transfer-engine-non-cuda (and apt-get install libibverbs1)")
    return found


class MooncakeMaster:
    def __init__(self, rpc_port: int | None = None, http_port: int | None = None,
                 metrics_port: int | None = None, lease_ttl_ms: int = 5000,
                 log_path: str | os.PathLike | None = None) -> None:
        self.rpc_port = rpc_port or free_port()
        self.http_port = http_port or free_port()
        self.metrics_port = metrics_port or free_port()
        self.lease_ttl_ms = lease_ttl_ms
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def rpc_address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metadata"

    def command(self) -> list[str]:
        return [master_binary(), "-rpc_address=127.0.0.1", f"-rpc_port={self.rpc_port}",
                "-enable_http_metadata_server=true", "-http_metadata_server_host=127.0.0.1",
                f"-http_metadata_server_port={self.http_port}", "-metrics_host=127.0.0.1",
                f"-metrics_port={self.metrics_port}",
                f"-default_kv_lease_ttl={self.lease_ttl_ms}"]

    def start(self, timeout_s: float = 20.0) -> Self:
        """Start (or restart, on the same ports) and wait until its RPC port accepts."""
        if self.log_path:
            with open(self.log_path, "ab") as out:  # the child keeps its own descriptor
                self.proc = subprocess.Popen(self.command(), stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True,
                                             preexec_fn=_die_with_parent)  # noqa: PLW1509 (one C call)
        else:
            self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_die_with_parent)  # noqa: PLW1509 (one C call)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited with {self.proc.returncode}")
            if self._answers(self.rpc_port) and self._answers(self.http_port):
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError("mooncake_master did not start listening")

    @staticmethod
    def _answers(port: int) -> bool:
        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex(("127.0.0.1", port)) == 0

    def stop(self, kill: bool = False) -> None:
        """Stop it (SIGKILL with `kill`: a crash, as the fault tests need)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def metrics(self) -> dict[str, float]:
        """The master's gauges (`master_allocated_bytes`, `master_key_count`, ...)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=2) as r:
            text = r.read().decode()
        out = {}
        for m in re.finditer(r"^(master_[a-z_]+) ([0-9.eE+-]+)$", text, re.MULTILINE):
            out[m.group(1)] = float(m.group(2))
        return out

    def allocated_bytes(self) -> int:
        return int(self.metrics().get("master_allocated_bytes", 0))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
