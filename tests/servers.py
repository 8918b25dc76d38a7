"""Start and stop real servers on 127.0.0.1 for the tests: any command that listens on a port.

`running(cmd, port=...)` starts a subprocess, waits until `ready_path` answers 200 (or the port
accepts connections), yields it, and always stops it (SIGTERM, then SIGKILL). Output goes to a
log file whose tail is shown when the server fails to come up.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import random
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SLOGATE = [sys.executable, "-m", "slogate"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> int:
    """A first port such that n consecutive ports are bindable the way servers bind them
    (SO_REUSEADDR: ports in TIME_WAIT from earlier tests count as free). Picked below the kernel's
    ephemeral range, so no outgoing connection (or `bind(0)` elsewhere) takes them meanwhile."""
    low, _ = _ephemeral_range()
    for _ in range(500):
        base = random.randrange(10000, max(10001, low - n))
        try:
            for p in range(base, base + n):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {n} consecutive free ports")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


class Server:
    """A running subprocess server."""

    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log
        self.url = f"http://127.0.0.1:{port}"

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def wait_ready(server: Server, ready_path: str | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log_text()[-3000:]}")
        try:
            if ready_path is None:
                with socket.create_connection(("127.0.0.1", server.port), timeout=0.5):
                    return
            else:
                with urllib.request.urlopen(server.url + ready_path, timeout=2) as resp:
                    if resp.status == 200:
                        return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"server not ready after {timeout}s:\n{server.log_text()[-3000:]}")


@contextlib.contextmanager
def running(
    cmd: Sequence[str],
    port: int,
    *,
    ready_path: str | None = "/health",
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
) -> Iterator[Server]:
    log = Path(tempfile.mkstemp(prefix="slogate-server-", suffix=".log")[1])
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=cwd or REPO)
    server = Server(proc, port, log)
    try:
        wait_ready(server, ready_path, timeout)
        yield server
    finally:
        server.stop()
        with contextlib.suppress(OSError):
            log.unlink()


@contextlib.contextmanager
def serve_in_thread(handler: type[socketserver.BaseRequestHandler],
                    server_class: type[socketserver.TCPServer] = http.server.ThreadingHTTPServer) -> Iterator[str]:
    """`handler` on 127.0.0.1, a port the kernel picked, in this process (a thread per connection) until
    the block exits; yields its URL. An in-test upstream or receiver (an HTTP handler by default, a raw
    `socketserver` one with `server_class=socketserver.ThreadingTCPServer`)."""
    server = server_class(("127.0.0.1", 0), handler)
    if isinstance(server, socketserver.ThreadingMixIn):
        server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
