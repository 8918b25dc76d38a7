"""Where the EPP's endpoints come from: `--endpoint` values, or a file re-read when it changes.

The file holds one endpoint per line (`IP:PORT`, or an upstream URL with the gateway's `#pool=...`
options); blank lines and lines starting with `#` are skipped. A changed list goes to the pool updater
(gateway/epp/pool.py, shared with the Kubernetes watch). Never blocks the loop for long: the file is
polled once a second with one `stat`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from slogate.gateway.epp.pool import Picker, PoolUpdater
from slogate.traces.usage import UsageError

if TYPE_CHECKING:
    from slogate.gateway.server import Gateway

log = logging.getLogger("slogate.epp")


def endpoint_url(text: str) -> str:
    """`10.0.0.5:8000` → `http://10.0.0.5:8000` (a URL passes through, its `#options` kept).

    Envoy's ORIGINAL_DST cluster connects to the header's value as it is: it must be an IP address
    and a port (a host name is not resolved), so anything else is a UsageError naming the value."""
    text = text.strip()
    url = text if "://" in text else "http://" + text
    authority = url.split("://", 1)[1].split("/", 1)[0].split("#", 1)[0]
    host, sep, port = (authority if "]" not in authority.rpartition(":")[2] else "").rpartition(":")  # an explicit port
    try:
        ipaddress.ip_address(host.strip("[]"))
        ok = bool(sep) and port.isdigit() and 0 < int(port) < 65536
    except ValueError:
        ok = False
    if not ok:
        raise UsageError(f"endpoint {text!r}: expected IP:PORT (e.g. 10.0.0.5:8000, [fd00::5]:8000); "
                         "Envoy routes to the address as given, so no host names")
    return url


def read_endpoints(path: str | Path) -> list[str]:
    """The endpoint URLs of the file; UsageError when it cannot be read."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UsageError(f"--endpoints-file {path}: {exc.strerror or exc}; give a readable file "
                         "with one IP:PORT per line") from None
    return [endpoint_url(line) for line in (raw.strip() for raw in lines) if line and not line.startswith("#")]


class EndpointsFile:
    """Polls the endpoints file; hands a changed list to the pool updater (gateway/epp/pool.py)."""

    def __init__(self, path: str, gateway: Gateway, picker: Picker, interval: float = 1.0) -> None:
        self.path = path
        self.interval = interval
        self._mtime = self._stat()
        # as the CLI read it at startup
        self.updater = PoolUpdater(gateway, picker, "endpoints file", current=read_endpoints(path))
        self._task: asyncio.Task | None = None

    def _stat(self) -> float | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns + st.st_size

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            mtime = self._stat()
            if mtime is None or mtime == self._mtime:
                continue
            self._mtime = mtime
            try:
                await self.updater.apply(read_endpoints(self.path))
            except UsageError as exc:
                log.warning("endpoints file not applied: %s", exc)
