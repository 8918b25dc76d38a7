"""A library's log line (text format) names its logger: its redacted arguments no longer say what it is about.

With no collector listening, `--otel` logged "WARNING Transient error <redacted> encountered while exporting
<redacted> batch, retrying in 1.06s.": neither that it was OpenTelemetry nor whether spans or metrics were
failing. The text format now puts the logger's name first (the JSON format already had `logger`).
"""

from __future__ import annotations

import signal

import orjson
import pytest

from tests.gateway.fixtures_gateway import CANARY, SIM_MODEL, http_request, start_gateway, wait_for
from tests.servers import free_port
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(60)

EXPORTERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
             "opentelemetry.exporter.otlp.proto.http.metric_exporter")


def _lines_of(text: str, logger: str) -> list[str]:
    return [line for line in text.splitlines() if f" {logger}: " in line]


@pytest.mark.slow  # about 3 s: the exporters' first retries, then a bounded shutdown
def test_otlp_exporter_lines_say_which_exporter_fails() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}", "OTEL_BSP_SCHEDULE_DELAY": "100",
           "OTEL_METRIC_EXPORT_INTERVAL": "200", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, \
            start_gateway(sim.url, "--otel", "--shutdown-grace", "0", env=env) as gw:
        body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": CANARY}], "max_tokens": 2}
        assert http_request(gw.url, "POST", "/v1/chat/completions", orjson.dumps(body),
                            {"Content-Type": "application/json", "Authorization": f"Bearer {CANARY}"})[0] == 200
        assert wait_for(lambda: all(_lines_of(gw.log_text(), name) for name in EXPORTERS)), gw.log_text()
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(timeout=30) == 0
        text = gw.log_text()
    for name in EXPORTERS:
        assert any("Transient error <redacted>" in line or "Failed to export" in line
                   for line in _lines_of(text, name)), text
    assert " slogate-gateway INFO listening on " in text  # slogate's own lines are unchanged
    assert "Traceback" not in text and CANARY not in text
