"""One truth for every number: the same requests give the same counts, good counts, attainment and
TTFT/TPOT/E2E counts and percentiles in `/slogate/status`, `/metrics`, `slogate trace stats --json`
and `slogate compare --json` of the capture; and a replay of the same fault mix straight against
the simulator records the same outcomes in results.json.

Real parts only: `slogate sim` (constant timing, faults by header and by seeded config), `slogate
gateway` with an admission limit, raw sockets for the client that hangs up, the CLI as a subprocess.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest

from slogate.replay.results import load as load_results
from slogate.traces.record import error_class
from slogate.traces.slo import is_good, parse_slo
from slogate.traces.summary import summarize
from tests.gateway.fixtures_gateway import (
    SIM_MODEL,
    get_json,
    http_request,
    metric_samples,
    metric_sum,
    start_gateway,
    trace_records,
    wait_for,
)
from tests.servers import SLOGATE, free_port
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(240)

SLO = "fast:ttft=0.5,tpot=0.015"
TTFT_BUCKETS_NAME = "gen_ai_server_time_to_first_token_seconds"


def _chat(max_tokens: int, *, stream: bool = True) -> bytes:
    return orjson.dumps({"model": SIM_MODEL, "messages": [{"role": "user", "content": "hello there"}],
                         "max_tokens": max_tokens, "stream": stream, "ignore_eos": True})


def _post(url: str, body: bytes, fault: str | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if fault:
        headers["x-slogate-fault"] = fault
    try:
        status, _, _ = http_request(url, "POST", "/v1/chat/completions", body, headers, timeout=30)
    except (ConnectionError, OSError):  # a stream the gateway had to cut (non-SSE error path)
        return -1
    return status


def _hang_up(url: str) -> None:
    """A client that reads the start of a stream and closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    body = _chat(200)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        got = b""
        while b"data:" not in got:
            got += s.recv(4096)


def _mix(gw_url: str, admin: str) -> int:
    """The seeded mix; returns how many measured requests it sent."""
    n = 0
    for i in range(8):  # good streams
        assert _post(gw_url, _chat(6 + i)) == 200
        n += 1
    for _ in range(2):  # TPOT-breaking: a 150 ms stall after 2 tokens of 8
        assert _post(gw_url, _chat(8), "stall_ms=150,stall_after=2") == 200
        n += 1
    for _ in range(2):  # 503 before the stream
        assert _post(gw_url, _chat(8), "error=503") == 503
        n += 1
    _post(gw_url, _chat(12), "reset_after=3")  # reset mid-stream (the gateway ends it with an error event)
    _post(gw_url, _chat(12), "error_after=3")  # an error event mid-stream
    n += 2
    for i in range(2):  # non-streaming
        assert _post(gw_url, _chat(5 + i, stream=False)) == 200
        n += 1
    _hang_up(gw_url)
    n += 1
    # 429 from the admission queue: one slow stream holds the only slot, the next is rejected at once.
    slow = threading.Thread(target=_post, args=(gw_url, _chat(4), "stall_ms=2000,stall_after=1"))
    slow.start()
    assert wait_for(lambda: metric_sum(metric_samples(admin), "slogate_inflight_requests") == 1, timeout=10)
    statuses = []
    wait_for(lambda: (statuses.append(_post(gw_url, _chat(4))) or statuses[-1] == 429), timeout=10)
    slow.join()
    assert statuses[-1] == 429
    return n + len(statuses) + 1


def _slogate_json(*args: str) -> dict:
    out = subprocess.run([*SLOGATE, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return orjson.loads(out.stdout)


def _assert_buckets_match(samples: dict, name: str, exact: list[float], **labels: str) -> None:
    """Every cumulative bucket of a /metrics histogram holds exactly the exact values at or below it."""
    buckets = [(lab["le"], v) for lab, v in samples[name + "_bucket"]
               if all(lab.get(k) == x for k, x in labels.items())]
    assert buckets, name
    per_le: dict[str, float] = {}
    for le, v in buckets:
        per_le[le] = per_le.get(le, 0) + v
    for le, count in per_le.items():
        bound = float("inf") if le == "+Inf" else float(le)
        assert count == sum(1 for x in exact if x <= bound), (name, le)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_cross_surface_one_gateway_run(tmp_path: Path):
    trace_dir = tmp_path / "capture"
    admin_port = free_port()
    with start_sim(timing="constant", ttft_ms=20, itl_ms=5, seed=7) as sim, start_gateway(
        sim.url, "--admin-listen", f"127.0.0.1:{admin_port}", "--trace-dir", str(trace_dir),
        "--trace-flush-interval", "0.2", "--slo", SLO, "--max-inflight-requests", "1", "--queue-size", "0",
    ) as gw:
        admin = f"http://127.0.0.1:{admin_port}"
        n = _mix(gw.url, admin)
        records = trace_records(trace_dir, n, timeout=20)
        assert len(records) == n
        status = get_json(admin + "/slogate/status")["windows"]["5m"]
        samples = metric_samples(admin)

    slo = parse_slo(SLO)
    ok = [r for r in records if error_class(r) is None]
    good = sum(is_good(r, slo) for r in records)
    classes = {error_class(r) for r in records} - {None}
    # the mix really is mixed: every kind of outcome is there
    assert {"rejected", "client_disconnect", "upstream_status", "reset", "stream_error_event"} <= classes
    assert 0 < good < len(ok) < n  # some successful requests break the TPOT bound

    expected = summarize(records, slos=[slo])
    stats = _slogate_json("trace", "stats", str(trace_dir), "--json", "--slo", SLO)["summary"]
    compare = _slogate_json("compare", str(trace_dir), str(trace_dir), "--json", "--slo", SLO, "--all")["metrics"]

    # counts, good counts, attainment: identical on every surface
    assert status["requests"] == stats["requests"] == compare["requests"]["values"][0] == n
    assert metric_sum(samples, "slogate_requests_total") == n
    assert status["errors"] == stats["failed"] == compare["failed"]["values"][0] == n - len(ok)
    assert status["slos"]["fast"]["good_requests"] == int(stats["goodput_by_slo"]["fast"]["good_requests"]) == good
    assert metric_sum(samples, "slogate_good_requests_total", slo="fast") == good
    assert metric_sum(samples, "slogate_slo_requests_total", slo="fast") == n  # the attainment denominator
    attainment = good / n
    assert status["slos"]["fast"]["attainment"] == pytest.approx(attainment, abs=1e-12)
    assert stats["slo_attainment"] == pytest.approx(attainment, abs=1e-12)
    assert compare["slo_attainment"]["values"][0] == pytest.approx(attainment, abs=1e-12)
    assert status["errors_by_class"] == stats["failed_by_class"] == expected.failed_by_class
    # TTFT/TPOT/E2E: counts and percentiles identical (status and the CLI), histograms bucket-exact
    for key in ("ttft", "tpot", "e2e"):
        dist = getattr(expected, f"{key}_s")
        for stat in ("count", "p50", "p90", "p99"):
            want = getattr(dist, stat)
            assert status[key][stat] == pytest.approx(want, rel=1e-9), (key, stat)
            assert stats[f"{key}_s"][stat] == pytest.approx(want, rel=1e-9), (key, stat)
            assert compare[f"{key}_s.{stat}"]["values"][0] == pytest.approx(want, rel=1e-9), (key, stat)
    assert metric_sum(samples, TTFT_BUCKETS_NAME + "_count") == expected.ttft_s.count
    assert metric_sum(samples, "gen_ai_server_time_per_output_token_seconds_count") == expected.tpot_s.count
    assert metric_sum(samples, "gen_ai_server_request_duration_seconds_count", error_type="") == expected.e2e_s.count
    _assert_buckets_match(samples, TTFT_BUCKETS_NAME, [r.ttft for r in ok if r.ttft is not None])
    _assert_buckets_match(samples, "gen_ai_server_request_duration_seconds", [r.e2e for r in ok if r.e2e is not None],
                          error_type="")
    # output tokens: failed streams count in throughput (never in goodput), the same total everywhere
    assert metric_sum(samples, "slogate_output_tokens_total") == stats["output_tokens"] == sum(
        r.output_tokens or 0 for r in records)


FAULTS = "error_rate=0.15,reset_rate=0.15,error_after_rate=0.15,seed=11"


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_replay_records_what_the_gateway_records(tmp_path: Path):
    """The same seeded fault mix (a fresh sim each time, requests one after another): captured at the
    gateway, and replayed straight against the sim — the same outcomes, classes and good counts."""
    workload = ["--synthetic", "concurrency:c=1", "--max-requests", "40", "--input-tokens", "fixed:32",
                "--output-tokens", "fixed:16", "--seed", "3", "--slo", "ttft=0.5", "--retries", "0"]
    trace_dir = tmp_path / "capture"
    admin_port = free_port()
    with start_sim(timing="constant", ttft_ms=10, itl_ms=2, fault=FAULTS) as sim, start_gateway(
        sim.url, "--admin-listen", f"127.0.0.1:{admin_port}", "--trace-dir", str(trace_dir),
        "--trace-flush-interval", "0.2", "--slo", "ttft=0.5",
    ) as gw:
        run = subprocess.run([*SLOGATE, "replay", *workload, "--target", gw.url, "--model", SIM_MODEL,
                              "--out", str(tmp_path / "through")], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        captured = trace_records(trace_dir, 40 + 0, timeout=20)
        status = get_json(f"http://127.0.0.1:{admin_port}/slogate/status")["windows"]["5m"]
    with start_sim(timing="constant", ttft_ms=10, itl_ms=2, fault=FAULTS) as sim:
        run = subprocess.run([*SLOGATE, "replay", *workload, "--target", sim.url, "--model", SIM_MODEL,
                              "--out", str(tmp_path / "direct")], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
    direct = load_results(tmp_path / "direct").summary
    measured = [r for r in captured if r.endpoint.endswith("completions")][-40:]  # the replay's own calibration aside
    gateway = summarize(measured, slos=[parse_slo("ttft=0.5")])
    assert direct.failed > 0 and direct.requests == 40
    assert gateway.failed_by_class == direct.failed_by_class
    assert gateway.failed == direct.failed and status["errors"] >= direct.failed
    assert gateway.goodput_by_slo["default"]["good_requests"] == direct.goodput_by_slo["default"]["good_requests"]
    assert gateway.slo_attainment == pytest.approx(direct.slo_attainment)
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert getattr(gateway, key).count == getattr(direct, key).count, key


@pytest.mark.parametrize("seed", [1, 2])
def test_two_candidates_that_keep_up_report_the_offered_rate(tmp_path: Path, seed: int):
    """Virtual time, one trace, a fast (H200) and a much slower (L4) candidate that both keep up:
    request rate and output tok/s within 1 % of each other; the slower one has the longer drain."""
    sides = {}
    for gpu in ("h200", "l4"):
        out = tmp_path / gpu
        run = subprocess.run([*SLOGATE, "replay", "--synthetic", "poisson:rate=0.5", "--max-requests", "300",
                              "--input-tokens", "fixed:256", "--output-tokens", "fixed:64", "--seed", str(seed),
                              "--target", f"sim:{gpu}/llama-3-8b", "--virtual", "--out", str(out)],
                             capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stderr
        sides[gpu] = load_results(out).summary
    fast, slow = sides["h200"], sides["l4"]
    assert slow.e2e_s.p50 > 3 * fast.e2e_s.p50  # really different candidates
    assert fast.failed == slow.failed == 0
    assert fast.duration_s == slow.duration_s and fast.window_start_s == slow.window_start_s
    assert slow.request_rate_rps == pytest.approx(fast.request_rate_rps, rel=0.01)
    assert slow.output_tokens_per_s == pytest.approx(fast.output_tokens_per_s, rel=0.01)
    assert fast.request_rate_rps == pytest.approx(fast.offered_rate_rps * (1 - 1 / 300), rel=0.01)
    assert slow.drain_s > fast.drain_s


def test_a_candidate_that_falls_behind_shows_lower_throughput_and_a_long_drain(tmp_path: Path):
    sides = {}
    for gpu in ("h200", "l4"):
        out = tmp_path / gpu
        run = subprocess.run([*SLOGATE, "replay", "--synthetic", "poisson:rate=4", "--max-requests", "400",
                              "--input-tokens", "fixed:512", "--output-tokens", "fixed:128", "--seed", "5",
                              "--target", f"sim:{gpu}/llama-3-8b", "--virtual", "--out", str(out)],
                             capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stderr
        sides[gpu] = load_results(out).summary
    fast, slow = sides["h200"], sides["l4"]
    assert slow.output_tokens_per_s < 0.8 * fast.output_tokens_per_s
    assert fast.request_rate_rps == pytest.approx(fast.offered_rate_rps, rel=0.05)  # H200 keeps up …
    assert slow.drain_s > 20 * max(fast.drain_s, 1.0) and slow.drain_requests > 10 * fast.drain_requests  # L4 not


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_a_replay_against_a_failing_sim_counts_failures_as_not_good(tmp_path: Path):
    """`--fault error_rate=0.3` answering 429, plus resets mid-stream: those requests are failed, by
    class, never good; attainment is good / all."""
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1, fault="error_rate=0.3,error_status=429,reset_rate=0.2,seed=4") \
            as sim:
        run = subprocess.run([*SLOGATE, "replay", "--synthetic", "constant:rate=40", "--max-requests", "80",
                              "--input-tokens", "fixed:32", "--output-tokens", "fixed:16", "--seed", "2",
                              "--slo", "ttft=1", "--retries", "0", "--target", sim.url, "--model", SIM_MODEL,
                              "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
    s = load_results(tmp_path / "run").summary
    assert set(s.failed_by_class) == {"upstream_status", "reset"}, s.failed_by_class
    assert 10 <= s.failed_by_class["upstream_status"] <= 40 and s.failed_by_class["reset"] >= 3
    assert s.failed == sum(s.failed_by_class.values())
    good = s.goodput_by_slo["default"]["good_requests"]
    assert good == s.requests - s.failed  # every successful request met the loose SLO; no failure did
    assert s.slo_attainment == pytest.approx(good / s.requests)
    assert s.ttft_s.count == s.requests - s.failed
