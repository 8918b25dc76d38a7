"""`slogate sweep --serve-cmd` with the real llama.cpp server (llama-cpp-python serving Gemma 3 270M):
the sweep starts one server per `n_ctx` value and stops it, records the exact command, and the
flag's effect shows in the measurement: 300-token prompts fail on a 256-token context and are
served on a 2048-token one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from slogate.replay.sweep import load
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.segments import write_segment
from tests.realservers import gemma_model_path
from tests.replay.test_sweep_serve import _children
from tests.servers import REPO

pytestmark = [pytest.mark.llama, pytest.mark.slow]


def test_serve_cmd_starts_llama_cpp_per_grid_point(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = gemma_model_path()
    serve = (f"env PYTHONPATH={REPO} HF_HUB_OFFLINE=1 {sys.executable} -m tests.realservers llama --model {model} "
             "--chat_format gemma --interrupt_requests False --n_threads 1 --n_threads_batch 1 "
             "--host 127.0.0.1 --port {port} --n_ctx {n_ctx}")
    trace = tmp_path / "t.jsonl.zst"
    write_segment(trace, TraceHeader(source="test", block_unit="tokens", block_size=16),
                  [RequestRecord(t=i * 1.0, input_tokens=300, output_tokens=4, max_tokens=4) for i in range(4)])
    out = tmp_path / "grid"
    before = _children()
    assert slogate(["sweep", str(trace), "--slo", "e2e=30", "--speeds", "1", "--quiet", "--endpoint", "completions",
                    "--no-stream", "--serve-cmd", serve, "--grid", "n_ctx=256,2048", "--out", str(out),
                    "--ready-timeout", "120"]) == 0
    assert _children() <= before  # both servers stopped
    grid = json.loads((out / "grid.json").read_text())
    by = {p["grid"]["n_ctx"]: p for p in grid["points"]}
    assert set(by) == {"256", "2048"} and all(p["status"] == "ok" for p in by.values())
    for n_ctx, attained in (("256", 0.0), ("2048", 1.0)):
        sweep = load(out / by[n_ctx]["dir"])
        [point] = sweep.points
        assert point.slo_attainment == attained, (n_ctx, point)
        assert point.failed == (4 if n_ctx == "256" else 0)  # every 300-token prompt overflows 256
        env = json.loads((out / by[n_ctx]["dir"] / point.dir / "results.json").read_text())["environment"]
        assert env["labels"]["serve_cmd"].endswith(f"--n_ctx {n_ctx}") and env["labels"]["grid.n_ctx"] == n_ctx
        assert env["server_kind"] == "llamacpp"
    assert load(out / by["2048"]["dir"]).max_x_meeting_slo == 1.0
    assert load(out / by["256"]["dir"]).max_x_meeting_slo is None
