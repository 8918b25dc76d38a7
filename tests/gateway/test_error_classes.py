"""The same failure gets the same error class through the gateway and through the replay client.

A real `slogate sim` injects each fault (`x-slogate-fault` header, or `--fault` rates for a whole
run); the replay client sends to the simulator directly, the gateway relays to it and writes its
trace. Both records must carry one `ErrorClass` (traces.record). Also: every class the gateway can
answer is in the vocabulary.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import orjson
import pytest

from slogate.gateway.errors import ERRORS
from slogate.gateway.exchange import UPSTREAM_ERRORS
from slogate.replay import client
from slogate.replay.cli.replay import main as replay_main
from slogate.replay.client import HTTP_ERRORS, ClientConfig
from slogate.replay.interrupt import INTERRUPTED_ERROR
from slogate.replay.sim.records import RECORD_ERRORS
from slogate.traces import formats
from slogate.traces.record import ERROR_CLASSES, LEGACY_ERRORS, RequestRecord
from tests.gateway.fixtures_gateway import SIM_MODEL, http_request, start_gateway, trace_records
from tests.servers import Server, free_port
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(120)

CHAT = "/v1/chat/completions"
TIMEOUT_S = 0.7  # the client's request timeout and the gateway's first-byte timeout

# fault header -> the class both sides record
CASES = {
    "error=500": "upstream_status",
    "error=503": "upstream_status",  # before the stream; one upstream, so nothing to retry on
    "error_after=3": "stream_error_event",
    "reset_after=3": "reset",
    "hang": "timeout_ttfb",
}


def body(max_tokens: int) -> bytes:
    return orjson.dumps({"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}],
                         "max_tokens": max_tokens, "stream": True, "ignore_eos": True})


async def replay_one(url: str, max_tokens: int, fault: str | None) -> RequestRecord:
    """One request the way `slogate replay` sends it (replay.client over replay.http)."""
    cfg = ClientConfig(base_url=url, model=SIM_MODEL, timeout_s=TIMEOUT_S,
                       headers={"x-slogate-fault": fault} if fault else {})
    pool = client.new_pool(cfg)
    try:
        f = client.start(pool, cfg, body(max_tokens), intended_ns=time.perf_counter_ns())
        return await client.complete(pool, cfg, f)
    finally:
        pool.close()


@pytest.fixture(scope="module")
def sim_and_gateway(tmp_path_factory) -> Iterator[tuple[Server, Server, object]]:
    trace_dir = tmp_path_factory.mktemp("error-classes")
    with (
        start_sim(timing="constant", ttft_ms=10, itl_ms=10, seed=1) as sim,
        start_gateway(sim.url, "--ttfb-timeout", f"{int(TIMEOUT_S * 1000)}ms", "--trace-dir", str(trace_dir),
                      "--trace-flush-interval", "0.2") as gw,
    ):
        yield sim, gw, trace_dir


async def test_same_fault_same_class_through_gateway_and_replay(sim_and_gateway):
    sim, gw, trace_dir = sim_and_gateway
    direct = {}
    for i, fault in enumerate(CASES):
        max_tokens = 20 + i  # tells the gateway's records apart
        direct[max_tokens] = (fault, await replay_one(sim.url, max_tokens, fault))
        await asyncio.to_thread(http_request, gw.url, "POST", CHAT, body(max_tokens),
                                {"Content-Type": "application/json", "x-slogate-fault": fault})
    records = await asyncio.to_thread(trace_records, trace_dir, len(CASES))
    at_gateway = {r.max_tokens: r for r in records}
    for max_tokens, (fault, rec) in direct.items():
        gw_rec = at_gateway[max_tokens]
        assert rec.error == gw_rec.error == CASES[fault], (fault, rec, gw_rec)


async def test_refused_upstream_is_connect_on_both_sides(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    rec = await replay_one(dead, 5, None)
    assert rec.error == "connect"
    with start_gateway(dead, "--trace-dir", str(tmp_path), "--trace-flush-interval", "0.2") as gw:
        status, _, raw = await asyncio.to_thread(http_request, gw.url, "POST", CHAT, body(5),
                                                 {"Content-Type": "application/json"})
        assert status == 502 and orjson.loads(raw)["error"]["code"] == "connect"
        (gw_rec,) = await asyncio.to_thread(trace_records, tmp_path, 1)
    assert gw_rec.error == rec.error == "connect"


def test_replay_cli_and_gateway_agree_on_a_failing_sim(tmp_path):
    """`slogate replay` against a sim whose every request fails (`--fault error_rate=1`), direct and
    through the gateway: the replay's records and the gateway's trace say `upstream_status`."""
    trace_dir = tmp_path / "trace"
    with (
        start_sim(timing="constant", ttft_ms=2, itl_ms=1, fault="error_rate=1") as sim,
        start_gateway(sim.url, "--trace-dir", str(trace_dir), "--trace-flush-interval", "0.2") as gw,
    ):
        for name, url in (("direct", sim.url), ("via", gw.url)):
            rc = replay_main(["--synthetic", "constant:rate=50", "--max-requests", "4", "--input-tokens", "fixed:10",
                              "--output-tokens", "fixed:3", "--target", url, "--out", str(tmp_path / name),
                              "--quiet"])
            assert rc == 0
        gw_records = trace_records(trace_dir, 4)
    _, direct = formats.load(tmp_path / "direct" / "requests.jsonl.zst")
    assert len(direct) == 4 and {r.error for r in direct} == {"upstream_status"}
    assert {r.error for r in gw_records} == {"upstream_status"} and {r.status for r in gw_records} == {500}


def test_every_class_written_is_in_the_vocabulary():
    assert set(ERRORS) <= ERROR_CLASSES
    assert set(UPSTREAM_ERRORS.values()) <= ERROR_CLASSES and set(HTTP_ERRORS.values()) <= ERROR_CLASSES
    assert {e for _, e, _ in RECORD_ERRORS.values()} <= ERROR_CLASSES
    assert set(LEGACY_ERRORS.values()) <= ERROR_CLASSES and not set(LEGACY_ERRORS) & ERROR_CLASSES
    assert INTERRUPTED_ERROR in ERROR_CLASSES
    assert {"timeout_ttfb", "timeout_idle", "timeout_total", "shutdown", "client_disconnect", "rejected",
            "incomplete_stream", "aborted", "stream_error_event", "upstream_status"} <= ERROR_CLASSES
