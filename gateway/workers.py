"""The supervisor of `slogate gateway --workers N`: N worker processes on one port, one gateway outside.

Creates the shared routing state and one clock base, starts N workers (gateway/worker.py), each
accepting on `listen` with SO_REUSEPORT; serves `admin_listen` itself, merging the workers' metrics
and status rows (gateway/admin_merge.py); restarts a worker that dies (its in-flight streams are
counted as lost); SIGTERM drains every worker. Never relays a request or opens an upstream connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import msgspec
import orjson
from aiohttp import web
from aiohttp.web_request import BaseRequest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from slogate.gateway.admin_merge import cumulative, merge_metrics, merge_status, parse
from slogate.gateway.capture import perf_epoch
from slogate.gateway.config import GatewayConfig, admin_address, parse_hostport, parse_slos, upstream_specs
from slogate.gateway.routing import shared_state
from slogate.gateway.status import WINDOWS, StatusRow, StatusWindow, health_response
from slogate.gateway.worker_admin import WORKER_STATUS_PATH, WorkerStatus, decode_worker_status
from slogate.gateway.worker_role import WorkerRole, WorkerStart
from slogate.traces.usage import UsageError

log = logging.getLogger("slogate.gateway")
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ASK_TIMEOUT_S = 5.0  # one worker's answer to a scrape
REFRESH_S = 2.0  # the supervisor reads each worker's /metrics at least this often
_QUICK_DEATH_S = 2.0  # a worker dying younger than this delays its restart (doubling, up to 5 s)


class Worker:
    """One slot of the pool: the current process for index `index`."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.generation = -1
        self.proc: asyncio.subprocess.Process | None = None
        self.started = 0.0
        self.backoff_s = 0.0
        self.socket = ""
        self.last_metrics: list[Metric] = []  # its latest exposition, kept in the totals when it dies
        self.last_status: WorkerStatus | None = None  # its rows as of the last /slogate/status, kept likewise
        self.deaths = 0  # +1 when its process is reaped: an answer asked before then is not the live one's


class Supervisor:
    def __init__(self, cfg: GatewayConfig, n: int, log_level: str = "info") -> None:
        self.cfg = cfg
        self.n = n
        self.log_level = log_level
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.runtime = Path(tempfile.mkdtemp(prefix="slogate-workers-", dir=base))  # 0700: sockets, state
        n_up = len(upstream_specs(cfg))
        state = self.runtime / "routing.state"
        shared_state.create(state, n_up, n)
        self.shared = shared_state.SharedRouting(state, n_up, n, worker=0)  # read and clear only
        self.start_ns, self.start_unix = perf_epoch()
        self.window = StatusWindow(parse_slos(cfg.slos), self.start_ns)
        self.workers = [Worker(i) for i in range(n)]
        self.retired: list[Metric] = []  # counters and histograms of dead workers (totals never go down)
        self.retired_rows: list[StatusRow] = []  # status rows of dead workers (pruned to the 5-minute window)
        self.retired_requests = 0
        self.restarts = 0
        self.lost_streams = 0
        self.stopping = False
        self.fatal: int | None = None
        self.stop = asyncio.Event()

    # ------------------------------------------------------------------ workers
    async def start_worker(self, w: Worker) -> None:
        w.generation += 1
        w.socket = str(self.runtime / f"worker-{w.index}.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(w.socket)
        role = WorkerRole(index=w.index, generation=w.generation, workers=self.n,
                          state_path=str(self.shared_path), admin_socket=w.socket,
                          start_ns=self.start_ns, start_unix=self.start_unix)
        start_file = self.runtime / f"worker-{w.index}.json"
        start_file.write_bytes(msgspec.json.encode(WorkerStart(self.cfg, role, self.log_level)))
        w.proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "slogate.gateway.worker", str(start_file))
        w.started = time.monotonic()
        log.info("worker %d started (pid %d, generation %d)", w.index, w.proc.pid, w.generation)

    @property
    def shared_path(self) -> Path:
        return self.runtime / "routing.state"

    async def watch(self, w: Worker) -> None:
        """Restart the worker whenever it exits, until the gateway stops."""
        while True:
            assert w.proc is not None
            rc = await w.proc.wait()
            if self.stopping:
                return
            # its streams and its queued requests: both clients' connections broke with it
            lost = self.shared.worker_inflight(w.index) + self.shared.worker_queued(w.index)
            self.shared.clear_worker(w.index)
            w.deaths += 1
            self.retired = merge_metrics([self.retired, cumulative(w.last_metrics)])
            w.last_metrics = []
            if w.last_status is not None:
                self.retired_rows += w.last_status.rows
                self.retired_requests += w.last_status.requests_total
                w.last_status = None
            if rc == 2:  # a usage error (e.g. the port is taken): restarting cannot help
                log.error("worker %d exited with a usage error: stopping the gateway", w.index)
                self.fatal = 2
                self.stop.set()
                return
            self.restarts += 1
            self.lost_streams += lost
            log.warning("worker %d (pid %d) exited with %s; %d in-flight requests lost; restarting",
                        w.index, w.proc.pid, rc, lost)
            age = time.monotonic() - w.started
            w.backoff_s = min(5.0, max(0.1, 2 * w.backoff_s)) if age < _QUICK_DEATH_S else 0.0
            if w.backoff_s:
                await asyncio.sleep(w.backoff_s)
            if self.stopping:
                return
            await self.start_worker(w)

    def forward(self, sig: int) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(sig)

    async def drain(self) -> None:
        """SIGTERM to every worker; each drains its streams within `shutdown_grace`."""
        self.stopping = True
        live = [w.proc for w in self.workers if w.proc is not None and w.proc.returncode is None]
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in live)), self.cfg.shutdown_grace + 10.0)
        except TimeoutError:
            for proc in live:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            await asyncio.gather(*(p.wait() for p in live))

    # ------------------------------------------------------------------ admin
    async def _ask(self, w: Worker, path: str) -> tuple[int, bytes] | None:
        """GET `path` from one worker's private socket; None when it does not answer."""
        if w.proc is None or w.proc.returncode is not None or not os.path.exists(w.socket):
            return None
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=w.socket),
                                             timeout=aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)) as session, \
                    session.get("http://worker" + path) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None

    async def _ask_each(self, path: str) -> list[bytes | None]:
        """Every worker's 200 answer to `path`, None for one that did not answer, or died (was reaped)
        meanwhile: its last answer was moved to the retired totals, this one must not count again."""
        deaths = [w.deaths for w in self.workers]
        answers = await asyncio.gather(*(self._ask(w, path) for w in self.workers))
        return [a[1] if a is not None and a[0] == 200 and w.deaths == d else None
                for w, a, d in zip(self.workers, answers, deaths, strict=True)]

    async def refresh(self) -> list[list[Metric]]:
        """Every worker's exposition: a fresh one from each that answers (kept as its last one); the last
        one's counters and histograms for one that does not (dead but not yet reaped, stopped, slow),
        so a total never goes down (Prometheus would read that as a counter reset)."""
        out = []
        for w, answer in zip(self.workers, await self._ask_each("/metrics"), strict=True):
            if answer is not None:
                w.last_metrics = parse(answer.decode())
                out.append(w.last_metrics)
            elif w.last_metrics:
                out.append(cumulative(w.last_metrics))
        return out

    async def keep_refreshed(self) -> None:
        """Between scrapes too: a worker that dies loses at most this interval's counts from the totals."""
        while True:
            await asyncio.sleep(REFRESH_S)
            await self.refresh()

    async def metrics(self, request: BaseRequest) -> web.Response:
        workers = await self.refresh()  # first: a worker reaped meanwhile is in self.retired after it
        families = merge_metrics([self.retired, *workers]) + self._own_families()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(families))
        return web.Response(body=generate_latest(registry), headers={"Content-Type": METRICS_CONTENT_TYPE})

    def _own_families(self) -> list:
        alive = GaugeMetricFamily("slogate_workers", "Worker processes serving the proxy port.")
        alive.add_metric([], sum(1 for w in self.workers if w.proc is not None and w.proc.returncode is None))
        restarts = CounterMetricFamily("slogate_worker_restarts", "Worker processes that died and were replaced.")
        restarts.add_metric([], self.restarts)
        lost = CounterMetricFamily("slogate_worker_lost_requests",
                                   "Requests in flight (streaming or queued for admission) in a worker process "
                                   "when it died (their connections broke).")
        lost.add_metric([], self.lost_streams)
        return [alive, restarts, lost]

    async def status(self, request: BaseRequest) -> web.Response:
        parts: list[WorkerStatus] = []
        silent: list[WorkerStatus] = []  # the last rows of workers that did not answer (kept, as for /metrics)
        for w, answer in zip(self.workers, await self._ask_each(WORKER_STATUS_PATH), strict=True):
            if answer is not None:
                w.last_status = decode_worker_status(answer)
                parts.append(w.last_status)
            elif w.last_status is not None:
                silent.append(w.last_status)
        now = self.window.now()
        horizon = now - WINDOWS[-1][1]
        self.retired_rows = [r for r in self.retired_rows if r.finished >= horizon]
        retired = WorkerStatus(self.retired_requests + sum(p.requests_total for p in silent),
                               self.retired_rows + [r for p in silent for r in p.rows], {})
        doc = await asyncio.to_thread(merge_status, self.window, parts, now, retired)
        doc["workers"] = {"configured": self.n, "answering": len(parts), "restarts": self.restarts,
                          "lost_requests": self.lost_streams,
                          "pids": [w.proc.pid if w.proc is not None and w.proc.returncode is None else None
                                   for w in self.workers]}
        return web.Response(body=orjson.dumps(doc), content_type="application/json")

    async def healthz(self, request: BaseRequest) -> web.Response:
        status, body = health_response(True)
        return web.Response(status=status, body=body, content_type="application/json")

    async def readyz(self, request: BaseRequest) -> web.Response:
        status, body = health_response(any(a is not None for a in await self._ask_each("/readyz")))
        return web.Response(status=status, body=body, content_type="application/json")

    def admin_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/slogate/status", self.status)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        return app

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; the exit code (2 when a worker hit a usage error)."""
        try:
            return await self._run()
        finally:
            shutil.rmtree(self.runtime, ignore_errors=True)

    async def _run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.forward, signal.SIGHUP)  # log rotation: every worker reopens
        host, port = parse_hostport(self.cfg.listen, key="listen")
        reserve = _reserve_port(host, port)  # an early, clear error when the port is taken
        admin_at = admin_address(self.cfg)
        assert admin_at is not None  # config validation: --workers needs its own admin listener
        ahost, aport = admin_at
        runner = web.AppRunner(self.admin_app(), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        watchers: list[asyncio.Task] = []
        try:
            await web.TCPSite(runner, ahost, aport, reuse_address=True).start()
            for w in self.workers:
                await self.start_worker(w)
            watchers = [asyncio.create_task(self.watch(w)) for w in self.workers]
            watchers.append(asyncio.create_task(self.keep_refreshed()))
            log.info("supervisor: %d workers on %s; merged admin on %s:%d", self.n, self.cfg.listen, ahost, aport)
            await self.stop.wait()
            log.info("supervisor: draining %d workers", self.n)
        finally:
            await self.drain()
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            await runner.cleanup()
            reserve.close()
        log.info("supervisor: stopped (%d restarts, %d requests lost)", self.restarts, self.lost_streams)
        return self.fatal or 0


class _Families:
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families


def _reserve_port(host: str, port: int) -> socket.socket:
    """Bind (never listen) `host:port` with SO_REUSEPORT: fails now if another program holds it;
    the workers join the same port group and only their listening sockets receive connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}; choose another --listen address") from None
    return sock
