"""`slogate sim`: parse flags and an optional TOML file, then serve N simulated replicas over HTTP.

Process lifecycle lives here (uvloop, signals, consecutive ports); the flags are parsed by options.py;
bad values raise traces.cli.UsageError naming the value and the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

from slogate.replay.sim.config import SimConfig, build
from slogate.replay.sim.faults import FaultConfig
from slogate.replay.sim.options import configure
from slogate.replay.sim.server import ServerOptions
from slogate.traces.fdtable import reserve_fds
from slogate.traces.usage import UsageError


async def serve(config: SimConfig, opts: ServerOptions, faults: FaultConfig) -> None:
    from aiohttp import web

    from slogate.replay.sim.gcpace import GcPacer
    from slogate.replay.sim.server import Replica

    spec = build(config)
    pacer = GcPacer()
    replicas = [Replica(spec, opts, faults, i, pacer) for i in range(config.replicas)]
    runners = []
    # last port first: once the first port answers, every replica is up
    for i, rep in reversed(list(enumerate(replicas))):
        runner = web.AppRunner(rep.app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, opts.host, opts.port + i, reuse_address=True, backlog=4096)
        try:
            await site.start()
        except OSError as exc:
            raise UsageError(f"cannot listen on {opts.host}:{opts.port + i}: {exc.strerror}; pick another --port") from None
        runners.append(runner)
        rep.start()
    print(f"slogate sim: {spec.model.name} on {config.tp}x {spec.gpu.name} ({config.timing}), "
          f"{spec.kv_blocks} KV blocks, max_num_seqs={spec.max_num_seqs}, "
          f"max_num_batched_tokens={spec.max_num_batched_tokens}, "
          f"listening on http://{opts.host}:{opts.port}" + (f"-{opts.port + config.replicas - 1}"
                                                          if config.replicas > 1 else ""), flush=True)
    if config.timing == "linear" and config.linear is not None:
        c = config.linear
        print(f"slogate sim: step ms = {c.a_ms:.4g} + {c.b_ms:.4g}·new_tokens + {c.c_ms:.4g}·seqs + "
              f"{c.d_ms:.4g}·kv_tokens", flush=True)
    reserve_fds()  # fd-table growth stalls the loop for ms: do it before the first stream
    pacer.install()  # garbage collection only in idle time: no pauses in the middle of a token pass
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    pacer.uninstall()
    for rep in replicas:
        await rep.stop()
    for runner in runners:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["calibrate"]:
        from slogate.replay.sim.calibrate import main as calibrate_main

        return calibrate_main(argv[1:])
    config, opts, faults = configure(argv)
    build(config)  # validate before binding ports
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(serve(config, opts, faults))
    return 0
