"""Ctrl-C / SIGTERM during a live replay: stop sending at once, drain in-flight requests, then cancel.

`Interrupt` owns the orchestrator's SIGINT/SIGTERM handlers (on the event loop, main thread only).
First signal: no new request is sent and in-flight ones get `drain_s` to finish; then (or at a second
signal) the rest are cancelled and recorded as interrupted. A signal before sending began cancels the
setup instead. `Stop` is what a sending worker watches. Never sends, measures or writes anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

from slogate.traces.record import ErrorClass

SIGNALS = (signal.SIGINT, signal.SIGTERM)
INTERRUPTED_STATUS = 499  # like the gateway's client-gone requests (nginx's "client closed request")
INTERRUPTED_ERROR: ErrorClass = "interrupted"


class Interrupted(Exception):
    """A signal arrived before any request was sent: nothing to write; exit 128 + signal number."""

    def __init__(self, signum: int):
        super().__init__(f"{signal.Signals(signum).name} before any request was sent")
        self.signum = signum


class Stop:
    """The two phases a worker follows: `sending` set = send nothing more; `cancel` set = cancel in-flight."""

    def __init__(self) -> None:
        self.sending = asyncio.Event()
        self.cancel = asyncio.Event()

    def now(self) -> None:
        """Stop sending and cancel in-flight requests at once."""
        self.sending.set()
        self.cancel.set()


class Interrupt:
    """Signal handling of one live run (see the module docstring); `signum` is the first signal seen."""

    def __init__(self, drain_s: float, *, quiet: bool = False):
        self.drain_s, self.quiet = drain_s, quiet
        self.stop = Stop()
        self.signum: int | None = None
        self.sending_began = False
        self._setup_task: asyncio.Task | None = None

    def _say(self, text: str) -> None:
        if not self.quiet:
            print(f"\nslogate replay: {text}", file=sys.stderr, flush=True)

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum = signum
            if not self.sending_began and self._setup_task is not None:
                self._setup_task.cancel()
                return
            self.stop.sending.set()
            asyncio.get_running_loop().call_later(self.drain_s, self.stop.cancel.set)
            self._say(f"{name}: sending stopped; waiting up to {self.drain_s:g}s for requests in flight "
                      "(a second Ctrl-C cancels them now); the results will still be written")
        elif not self.stop.cancel.is_set():
            self.stop.cancel.set()
            self._say(f"{name} again: cancelling the requests in flight")

    @contextlib.contextmanager
    def installed(self) -> Iterator[Interrupt]:
        """Handle SIGINT/SIGTERM on the running loop for the block; the previous handlers come back after."""
        if threading.current_thread() is not threading.main_thread():  # signals are the main thread's
            yield self
            return
        loop = asyncio.get_running_loop()
        self._setup_task = asyncio.current_task()
        previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self.on_signal, sig)
        try:
            yield self
        finally:
            for sig in SIGNALS:
                loop.remove_signal_handler(sig)
                if previous[sig] is not None:
                    signal.signal(sig, previous[sig])


@contextlib.contextmanager
def deferred() -> Iterator[list[int]]:
    """Signals during the block are noted (in the yielded list), not raised: results are written whole.
    Off the main thread (which alone receives signals) nothing is deferred and the list stays empty."""
    seen: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in SIGNALS:
        signal.signal(sig, lambda signum, _frame: seen.append(signum))
    try:
        yield seen
    finally:
        for sig in SIGNALS:
            signal.signal(sig, previous[sig] if previous[sig] is not None else signal.SIG_DFL)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so the same cleanup as Ctrl-C runs (`signals_as_interrupt`)."""


@contextlib.contextmanager
def held_then_raised() -> Iterator[None]:
    """A Ctrl-C or SIGTERM must not cut a cleanup short (stopping a child process): it is held while the
    block runs (`deferred`) and raised (KeyboardInterrupt / Terminated) right after it."""
    with deferred() as held:
        yield
    if held:
        raise Terminated() if held[0] == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """For a command that starts processes outside a live run (the demo, `sweep --serve-cmd`): within the
    block Ctrl-C raises KeyboardInterrupt and SIGTERM raises `Terminated`, so try/finally cleanup runs.
    SIGINT is set explicitly: a process started with it ignored (a script's `cmd &`) would otherwise not
    react to it at all. A live run's `Interrupt` takes both signals over while it runs."""

    def on_term(signum: int, frame: object) -> None:
        raise Terminated()

    if threading.current_thread() is not threading.main_thread():  # signals are the main thread's
        yield
        return
    old = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
           signal.SIGTERM: signal.signal(signal.SIGTERM, on_term)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def interrupt_status(exc: KeyboardInterrupt) -> tuple[int, str]:
    """The exit status (128 + the signal's number) and the word for a KeyboardInterrupt or `Terminated`."""
    return (143, "terminated") if isinstance(exc, Terminated) else (130, "interrupted")


@contextlib.contextmanager
def blocked() -> Iterator[None]:
    """SIGINT/SIGTERM held pending in this thread for the block; a process started meanwhile inherits
    the mask, so it can ignore them before they reach it (the orchestrator tells it when to stop)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_signals() -> None:
    """In a worker process: SIGINT/SIGTERM (a terminal sends them to the whole group) are ignored,
    then unblocked; the orchestrator alone decides when workers stop."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
