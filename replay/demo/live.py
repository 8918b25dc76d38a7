"""What the demo shows while it works: step lines, progress bars (rich, on a terminal) or plain
lines, and the gateway's live `/slogate/status` during the replay through it.

Display only: reads the status JSON and child liveness, never starts or stops a process.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence

import orjson

from slogate.replay.demo.procs import Child, http_get
from slogate.traces.usage import UsageError

POLL_S = 0.5  # how often the live loop checks the children and redraws


class Display:
    """mode: "rich" (progress bars), "plain" (lines only, e.g. not a terminal) or "quiet" (results only)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._console = None
        if mode == "rich":
            from rich.console import Console

            self._console = Console(highlight=False)

    def say(self, text: str) -> None:
        """A step or info line (not in quiet mode)."""
        if self.mode == "quiet":
            return
        if self._console is not None:
            self._console.print(text, markup=False)
        else:
            print(text, flush=True)

    def result(self, text: str) -> None:
        """A line shown in every mode (the output folder, a warning)."""
        print(text, flush=True)

    @contextlib.contextmanager
    def task(self, title: str, total: float | None = None) -> Iterator[Callable[[float, str], None]]:
        """A step: its title line, then a progress bar (total known) or a spinner labelled with the
        title's first words ("step 2/4"); yields `update(completed, detail)`."""
        t0 = time.monotonic()
        self.say(title)
        if self._console is None:
            yield lambda completed, detail: None
            self.say(f"  done in {time.monotonic() - t0:.1f} s")
            return
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        columns = [SpinnerColumn(), TextColumn("  {task.description}")]
        if total:
            columns.append(BarColumn(bar_width=30))
        columns += [TimeElapsedColumn(), TextColumn("{task.fields[detail]}")]
        with Progress(*columns, console=self._console, transient=False) as progress:
            task_id = progress.add_task(title.split("  ")[0], total=total, detail="")

            def update(completed: float, detail: str) -> None:
                progress.update(task_id, completed=min(completed, total or completed), detail=detail)

            yield update
            progress.update(task_id, completed=total or 1, total=total or 1, detail="done")


def status_line(doc: dict, slo_name: str, window: str = "1m") -> str:
    """One line from a `/slogate/status` document: rate, throughput, goodput, attainment, TTFT/TPOT p99."""
    w = doc.get("windows", {}).get(window) or {}
    slo = (w.get("slos") or {}).get(slo_name) or {}
    attainment = slo.get("attainment")
    return (f"{w.get('request_rate', 0.0):5.2f} req/s {w.get('output_tokens_per_s', 0.0):5.0f} tok/s | goodput "
            f"{slo.get('goodput_requests_per_s', 0.0):5.2f} req/s, attainment "
            f"{'  –  ' if attainment is None else f'{100 * attainment:5.1f}%'} | p99 TTFT "
            f"{_ms((w.get('ttft') or {}).get('p99'))}, TPOT {_ms((w.get('tpot') or {}).get('p99'))} | "
            f"{w.get('requests', 0)} done, {w.get('errors', 0)} errors")


def _ms(seconds: float | None) -> str:
    return "    –  " if seconds is None else f"{seconds * 1e3:5.0f} ms"


def fetch_status(admin_url: str) -> dict | None:
    try:
        return orjson.loads(http_get(f"{admin_url}/slogate/status", timeout_s=2.0))
    except (OSError, orjson.JSONDecodeError):
        return None


def watch_replay(replay: Child, watched: Sequence[Child], admin_url: str, *, title: str, duration_s: float, drain_s: float,
                 slo_name: str, every_s: float, display: Display) -> dict | None:
    """Wait for the replay client to finish, printing the gateway's status every `every_s` seconds.

    Returns the last status document. A watched process (sim, gateway) that dies, a replay that
    fails, or one still running `drain_s` after its schedule ended is a UsageError."""
    t0 = time.monotonic()
    last_print = t0
    doc: dict | None = None
    with display.task(title, total=duration_s) as update:
        display.say(f"  the gateway's live /slogate/status every {every_s:g} s (window: the last minute of finished requests):")
        while replay.alive():
            now = time.monotonic()
            elapsed = now - t0
            for child in watched:
                if not child.alive():
                    raise UsageError(f"{child.name} exited with status {child.proc.returncode} during the replay: "
                                     f"{child.log_tail()} (log: {child.log})")
            if elapsed > duration_s + drain_s:
                raise UsageError(f"the replay through the gateway is still running {drain_s:.0f} s after its "
                                 f"schedule ended (log: {replay.log}); try a lower --speed")
            if now - last_print >= every_s:
                last_print = now
                doc = fetch_status(admin_url) or doc
                if doc is not None:
                    display.say(f"  [{elapsed:3.0f}s] {status_line(doc, slo_name)}")
            done = f"{doc.get('requests_total', 0)} requests done" if doc else ""
            detail = f"sending, {done}" if elapsed < duration_s else f"waiting for the last streams, {done}"
            update(elapsed, detail)
            time.sleep(POLL_S)
    if replay.proc.returncode != 0:
        raise UsageError(f"the replay client failed with status {replay.proc.returncode}: {replay.log_tail()} "
                         f"(log: {replay.log})")
    return fetch_status(admin_url) or doc
