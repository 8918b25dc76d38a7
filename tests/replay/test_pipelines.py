"""Replay in pipelines: plain progress lines when stderr is captured, Retry-After honoured with jitter,
OPENAI_BASE_URL/OPENAI_API_KEY fallbacks and `--config run.toml`.

The Retry-After check talks to a raw asyncio HTTP server that answers 429 `Retry-After: 2` once and
timestamps each arrival; the rest runs `slogate replay` as a subprocess against the simulator.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import time

import pytest

from slogate.replay import client
from slogate.replay.client import ClientConfig, parse_retry_after, retry_delay
from tests.servers import SLOGATE
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(60)

OK = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
TOO_MANY = (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\n\r\n{}")


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_429_retry_after_2_delays_the_retry_at_least_2s() -> None:
    arrivals: list[float] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            arrivals.append(time.perf_counter())
            writer.write(TOO_MANY if len(arrivals) == 1 else OK)
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cfg = ClientConfig(base_url=f"http://127.0.0.1:{port}", stream=False, retries=2, retry_backoff_s=0.01,
                       timeout_s=10)
    pool = client.new_pool(cfg)
    try:
        f = client.start(pool, cfg, b'{"model":"m"}', intended_ns=time.perf_counter_ns())
        record = await client.complete(pool, cfg, f)
    finally:
        pool.close()
        server.close()
    assert record.status == 200 and len(arrivals) == 2
    assert 2.0 <= arrivals[1] - arrivals[0] < 2.5, arrivals[1] - arrivals[0]


def test_retry_delay_is_jittered_and_never_below_retry_after() -> None:
    cfg = ClientConfig(base_url="http://x", retry_backoff_s=0.5, timeout_s=30)
    rng = random.Random(1)
    plain = [retry_delay(cfg, 1, None, rng) for _ in range(200)]
    assert min(plain) >= 0.25 and max(plain) < 0.75 and len(set(plain)) > 100  # jittered, not in step
    assert min(retry_delay(cfg, 1, "2", rng) for _ in range(200)) >= 2.0
    assert retry_delay(cfg, 1, "3600", rng) == 30  # capped at the request timeout
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0 and parse_retry_after("soon") is None


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_config_file_env_fallbacks_and_plain_progress(tmp_path) -> None:
    out = tmp_path / "run"
    (tmp_path / "run.toml").write_text(
        '[replay]\nsynthetic = "constant:rate=20"\nmax-requests = 30\ninput-tokens = "fixed:32"\n'
        'output-tokens = "fixed:8"\nprogress-interval = "0.3s"\nslo = ["ttft=5"]\n'
        f'out = "{out}"\n')
    with start_sim(timing="constant", ttft_ms=10, itl_ms=2) as sim:
        env = {**os.environ, "OPENAI_BASE_URL": sim.url + "/v1", "OPENAI_API_KEY": "sk-canary-pipeline"}
        env.pop("SLOGATE_API_KEY", None)
        run = subprocess.run([*SLOGATE, "replay", "--config", str(tmp_path / "run.toml"), "--tokenizer", "none"],
                             capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    lines = [x for x in run.stderr.splitlines() if x.startswith("slogate replay: progress ")]
    assert len(lines) >= 3, run.stderr  # ≥ 1.5 s of sending at 0.3 s, plus the final line
    last = lines[-1]
    assert "done=30/30" in last and "failed=0" in last and "rate=" in last and "lag_p99=" in last and "eta=" in last
    results = json.loads((out / "results.json").read_text())
    assert sim.url.split("//")[1] in json.dumps(results)  # OPENAI_BASE_URL (without /v1) was the target
    for path in out.iterdir():
        assert b"sk-canary-pipeline" not in path.read_bytes()


def test_config_unknown_key_is_a_usage_error(tmp_path) -> None:
    (tmp_path / "bad.toml").write_text('[replay]\ntarget = "http://127.0.0.1:9"\nspeeed = 2\n')
    run = subprocess.run([*SLOGATE, "replay", "--config", str(tmp_path / "bad.toml"), "--synthetic", "poisson:rate=1"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "'speeed'" in run.stderr, run.stderr
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_BASE_URL"}
    run = subprocess.run([*SLOGATE, "replay", "--synthetic", "poisson:rate=1"], capture_output=True, text=True,
                         timeout=30, env=env)
    assert run.returncode == 2 and "OPENAI_BASE_URL" in run.stderr, run.stderr
