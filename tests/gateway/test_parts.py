"""Pure parts of the gateway: metric histograms and rendering, the status window, error shapes,
header forwarding, routing, timeouts and log redaction."""

from __future__ import annotations

import asyncio
import logging
import time
from time import perf_counter_ns

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slogate.gateway.config import Timeouts
from slogate.gateway.errors import json_error, sse_error
from slogate.gateway.headers import RequestFields, forward_request_fields, forward_response_fields
from slogate.gateway.live_metrics import LiveMetrics, MetricsCollector, make_registry, render
from slogate.gateway.logs import RedactFilter
from slogate.gateway.overhead import Overhead
from slogate.gateway.status import StatusWindow
from slogate.gateway.timeouts import Deadlines, Watchdog, limits_ns
from slogate.gateway.upstream import Upstream
from slogate.traces.histogram import Histogram
from slogate.traces.http1 import parse_head
from slogate.traces.record import RequestRecord
from slogate.traces.slo import parse_slo


def rec(**kw) -> RequestRecord:
    base = dict(t=0.0, model="m", input_tokens=10, output_tokens=5, ttft=0.1, tpot=0.02, e2e=0.2,
                upstream="127.0.0.1:1", finish_reason="stop", overhead=0.0002)
    base.update(kw)
    return RequestRecord(**base)


def test_histogram_buckets_are_le_cumulative():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0):
        h.observe(v)
    assert h.buckets() == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert h.sum == 2.65


def test_metrics_render_and_parse():
    m = LiveMetrics(["fast", "slow"], max_models=2)
    m.observe(rec(), (True, False), [0.01, 0.02])
    m.observe(rec(model="b", status=500, error="upstream_status", finish_reason=None), (False, False), None)
    m.observe(rec(model="c", finish_reason="weird"), (True, True), None)  # third model folds into "other"
    registry = make_registry(MetricsCollector(m, lambda: [("127.0.0.1:1", 3, 99)], lambda: (7, 1)))
    text = render(registry).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    reqs = {(s.labels["finish_reason"], s.labels["gen_ai_request_model"], s.labels["status_class"],
             s.labels["upstream"]): s.value for s in fams["slogate_requests"].samples}
    assert reqs[("stop", "m", "2xx", "127.0.0.1:1")] == 1
    assert reqs[("error", "b", "5xx", "127.0.0.1:1")] == 1
    assert reqs[("other", "other", "2xx", "127.0.0.1:1")] == 1
    good = {s.labels["slo"]: s.value for s in fams["slogate_good_requests"].samples}
    assert good == {"fast": 2, "slow": 1}
    ttft_count = [s for s in fams["gen_ai_server_time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert sum(s.value for s in ttft_count) == 2  # the failed request is not a TTFT sample
    itl = [s for s in fams["slogate_inter_token_latency_seconds"].samples if s.name.endswith("_count")]
    assert itl[0].value == 2
    tok = {(s.labels["gen_ai_token_type"], s.labels["gen_ai_request_model"]): s.value
           for s in fams["gen_ai_client_token_usage"].samples if s.name.endswith("_sum")}
    assert tok[("output", "m")] == 5 and tok[("input", "m")] == 10
    inflight = {s.labels["upstream"]: s.value for s in fams["slogate_inflight_tokens"].samples}
    assert inflight == {"127.0.0.1:1": 99}
    trace = {s.labels["outcome"]: s.value for s in fams["slogate_trace_records"].samples}
    assert trace == {"written": 7, "dropped": 1}
    for name in ("gen_ai_server_time_per_output_token_seconds", "gen_ai_server_request_duration_seconds",
                 "slogate_queue_seconds", "slogate_gateway_overhead_seconds", "slogate_good_output_tokens",
                 "slogate_output_tokens", "slogate_input_tokens", "slogate_inflight_requests",
                 "slogate_event_loop_lag_seconds"):
        assert name in fams, name


def test_status_window_rates_goodput_attainment():
    slos = [parse_slo("fast:ttft=0.15"), parse_slo("strict:ttft=0.05")]
    w = StatusWindow(slos, perf_counter_ns() - 120 * 10**9)  # as if the gateway had run for 2 minutes
    for i in range(10):
        w.add(rec(t=w.now() - 0.35, ttft=0.1 if i < 8 else 0.3, e2e=0.35))
    w.add(rec(t=w.now() - 0.01, status=502, error="connect", ttft=None, tpot=None, e2e=0.01, output_tokens=None))
    snap = w.snapshot()
    one = snap["windows"]["1m"]
    assert one["requests"] == 11 and one["errors"] == 1 and one["errors_by_class"] == {"connect": 1}
    assert abs(one["request_rate"] - 11 / 60) < 1e-9
    assert abs(one["output_tokens_per_s"] - 50 / 60) < 1e-9  # each token counted when it was produced
    assert one["slos"]["fast"]["good_requests"] == 8
    assert abs(one["slos"]["fast"]["attainment"] - 8 / 11) < 1e-9
    assert one["slos"]["strict"]["attainment"] == 0
    assert one["ttft"]["p50"] == 0.1 and one["ttft"]["count"] == 10
    assert snap["windows"]["5m"]["requests"] == 11
    orjson.dumps(snap)


def test_status_window_prunes_old_entries():
    w = StatusWindow([])
    w.add(rec())
    w.rows[0].finished = w.now() - 400
    w.add(rec())
    assert len(w.rows) == 1


def test_error_shapes():
    resp = json_error("timeout_ttfb", "x")
    body = orjson.loads(resp.body)
    assert resp.status == 504
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "timeout_ttfb" and body["error"]["param"] is None
    ev = sse_error("reset")
    assert ev.startswith(b"data: {") and ev.endswith(b"\n\ndata: [DONE]\n\n")
    assert sse_error("reset", new_event=False).startswith(b"\n\ndata: ")


def test_header_forwarding_drops_hop_by_hop():
    raw = [(b"Host", b"a"), (b"Connection", b"keep-alive, X-Private"), (b"X-Private", b"1"),
           (b"Keep-Alive", b"5"), (b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"3"),
           (b"Authorization", b"Bearer k"), (b"X-Custom", b"1"), (b"x-custom", b"2"), (b"TE", b"trailers"),
           (b"X-Latin", b"caf\xe9"), (b"X-Slogate-Priority", b"9")]
    h = RequestFields([(k.lower(), k, v) for k, v in raw])
    assert h.control and h.get("x-custom") == "1" and h.getall("X-CUSTOM") == ["1", "2"]
    out = forward_request_fields(h)
    assert out == (b"Authorization: Bearer k\r\nX-Custom: 1\r\nx-custom: 2\r\nX-Latin: caf\xe9\r\n"
                   b"X-Slogate-Priority: 9\r\n")
    assert b"X-Slogate" not in forward_request_fields(h.without_control())
    assert not h.without_control().control
    head = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nContent-Type: x\r\nUpgrade: h2c\r\n"
                      b"Connection: X-Private\r\nX-Private: 1\r\nX-Latin: caf\xe9 \xc3\xa9")
    # hop-by-hop and Connection-named fields go; every other field's bytes are passed on unchanged
    assert forward_response_fields(head, drop_length=True) == b"Content-Type: x\r\nX-Latin: caf\xe9 \xc3\xa9\r\n"
    assert forward_response_fields(head, drop_length=False) == (
        b"Content-Length: 9\r\nContent-Type: x\r\nX-Latin: caf\xe9 \xc3\xa9\r\n")


def test_upstream_name_hides_credentials():
    ups = [Upstream("http://127.0.0.1:1"), Upstream("http://u:pw@127.0.0.1:2/base/")]
    assert [u.name for u in ups] == ["127.0.0.1:1", "127.0.0.1:2"]
    assert ups[1].base == "http://u:pw@127.0.0.1:2/base" and "pw" not in ups[1].name


async def _guarded(deadlines: Deadlines, timeouts: Timeouts, gap: float, pieces: int, *, stream: bool = True):
    wd = Watchdog(deadlines, limits_ns(timeouts), time.perf_counter_ns())
    if stream:
        wd.streaming(time.perf_counter_ns())
    else:
        wd.waiting_first_byte(time.perf_counter_ns())
    try:
        for _ in range(pieces):
            await asyncio.sleep(gap)
            wd.last_ns = time.perf_counter_ns()
    except asyncio.CancelledError:
        asyncio.current_task().uncancel()
    finally:
        wd.stop()
    return wd.fired


async def test_watchdog_fires_on_idle_ttfb_total_and_not_while_active():
    deadlines = Deadlines(tick_s=0.01)
    deadlines.start()
    try:
        t = Timeouts(idle=0.3, ttfb=1, total=5)
        assert await _guarded(deadlines, t, 0.03, 15) is None  # 0.45 s of activity with 30 ms gaps
        assert await _guarded(deadlines, t, 1.0, 1) == "timeout_idle"
        assert await _guarded(deadlines, Timeouts(ttfb=0.05), 1.0, 1, stream=False) == "timeout_ttfb"
        assert await _guarded(deadlines, Timeouts(total=0.05, idle=10), 1.0, 1) == "timeout_total"
        assert not deadlines.slots  # every watchdog unfiled
    finally:
        await deadlines.stop()


async def test_deadlines_refile_and_unfile():
    d = Deadlines(tick_s=0.01)
    wd = Watchdog(d, (None, None, None), time.perf_counter_ns())  # no limits: filed only by hand here
    d.file(wd, time.perf_counter_ns() + 50_000_000)
    assert sum(len(b) for b in d.slots.values()) == 1
    d.file(wd, time.perf_counter_ns() + 90_000_000)
    assert sum(len(b) for b in d.slots.values()) == 1
    d.unfile(wd)
    assert not d.slots and wd.slot is None


async def test_deadlines_arm_one_timer_for_the_earliest_slot_not_every_tick():
    """Far deadlines (the defaults: a minute and more) cost no wake-ups per tick while requests run."""
    d = Deadlines(tick_s=0.01)
    d.start()
    loop = asyncio.get_running_loop()
    far, near = (Watchdog(d, (None, None, None), perf_counter_ns()) for _ in range(2))
    try:
        d.file(far, perf_counter_ns() + 5_000_000_000)
        assert d._tick is not None and d._tick.when() - loop.time() > 4.5
        d.file(near, perf_counter_ns() + 1_000_000_000)  # an earlier slot re-arms the one timer
        assert 0.5 < d._tick.when() - loop.time() < 1.5
        d.unfile(near)
        d.sweep(perf_counter_ns())  # nothing due: the far watchdog stays filed
        assert d.slots and far.slot is not None
    finally:
        d.unfile(far)
        await d.stop()


def test_log_redaction_drops_addresses_and_exception_text():
    record = logging.LogRecord("aiohttp.server", logging.ERROR, "x", 1, "Error handling request from %s",
                               ("10.1.2.3",), None)
    try:
        raise ValueError("secret prompt text")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    RedactFilter().filter(record)
    text = logging.Formatter().format(record)
    assert "10.1.2.3" not in text and "secret" not in text and "ValueError" in text


@pytest.mark.parametrize(("msg", "args", "shown"), [
    # OpenTelemetry's retry warning came out as "… retrying in %.2fs." (only %s and %r were replaced)
    ("Transient error %s encountered while exporting %s batch, retrying in %.2fs.", ("UNAVAILABLE", "span", 1.234),
     "Transient error <redacted> encountered while exporting <redacted> batch, retrying in 1.23s."),
    ("100%% of %s at %d", ("secret prompt text", 7), "100% of <redacted> at 7"),
    ("%5.1f ms for %r", (2.25, b"secret"), "  2.2 ms for <redacted>"),
    ("%(who)s said %(what)s", ({"who": "10.1.2.3", "what": "secret"},), "<redacted> said <redacted>"),
])
def test_log_redaction_keeps_numbers_and_drops_the_rest(msg: str, args: tuple, shown: str) -> None:
    record = logging.LogRecord("opentelemetry.exporter", logging.WARNING, "x", 1, msg, args, None)
    RedactFilter().filter(record)
    assert record.getMessage() == shown


def test_overhead_counts_waits_once_and_closes_a_wait_left_open():
    ov = Overhead()
    t0 = ov.wait_start()
    t1 = ov.wait_end()
    assert ov.wait_ns == t1 - t0 and ov.wait_end() >= t1 and ov.wait_ns == t1 - t0  # a second end adds nothing
    ov.sink_ns = 5
    t2 = ov.wait_start()  # a wait a cancellation never ended
    end = t2 + 1_000_000
    assert ov.busy_ns(t0, end) == (end - t0) - ((t1 - t0) + (end - t2)) + 5
    assert Overhead().busy_ns(10, 5) == 0
