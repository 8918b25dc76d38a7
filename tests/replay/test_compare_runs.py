"""Real runs for the compare, report and sweep tests: a small trace replayed against the simulator.

`make_trace` writes a slogate trace of evenly spaced fixed-length requests; `replay(...)` runs it
through `slogate replay` (virtual time unless `virtual=False`) into a run directory. The sim runs
with max_num_seqs=4 and no jitter; with 64-token prompts every step is memory-bound, so a step takes
the same time whatever the batch (the sim's own roofline at a full decode batch, `step_s()`), and the
engine's capacity is known: 4 sequences / (10 output tokens × step) requests/s (≈ 52 req/s on H100).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slogate.cli import main as slogate
from slogate.replay.results import load
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.segments import write_segment

MAX_SEQS = 4
OUT_TOKENS = 10
IN_TOKENS = 64
SLO = "ttft=0.1"


def sim_target(gpu: str = "h100-sxm", max_seqs: int = MAX_SEQS) -> str:
    return f"sim:{gpu}/llama-3-8b?max_num_seqs={max_seqs}&jitter=0"


def step_s(gpu: str = "h100-sxm") -> float:
    """Step time of a full decode batch, from the simulator's own step model."""
    from slogate.replay.sim.config import SimConfig, build, step_model

    spec = build(SimConfig(gpu=gpu, model="llama-3-8b", max_num_seqs=MAX_SEQS, jitter=0.0))
    kv_tokens = MAX_SEQS * (IN_TOKENS + OUT_TOKENS)
    return step_model(spec, 0)(MAX_SEQS, MAX_SEQS, kv_tokens, 0.0)


def capacity_rps(gpu: str = "h100-sxm", seats: int = MAX_SEQS) -> float:
    """`seats` requests in flight: every step decodes that many tokens and on average prefills
    seats / OUT_TOKENS prompts; the step model is affine, so the mean step is the mean shape's step."""
    from slogate.replay.sim.config import SimConfig, build, step_model

    spec = build(SimConfig(gpu=gpu, model="llama-3-8b", max_num_seqs=MAX_SEQS, jitter=0.0))
    starts = seats / OUT_TOKENS
    mean_step = step_model(spec, 0)(seats + starts * IN_TOKENS, seats, seats * (IN_TOKENS + OUT_TOKENS),
                                    starts * IN_TOKENS * IN_TOKENS / 2)
    return seats / (OUT_TOKENS * mean_step)


def make_trace(path: Path, *, rate: float = 20.0, seconds: float = 5.0) -> Path:
    """Evenly spaced requests (`rate`/s for `seconds`), IN_TOKENS in, OUT_TOKENS out."""
    n = int(rate * seconds)
    records = [RequestRecord(t=i / rate, input_tokens=IN_TOKENS, output_tokens=OUT_TOKENS, max_tokens=OUT_TOKENS)
               for i in range(n)]
    write_segment(path, TraceHeader(source="test", block_unit="tokens", block_size=16), records)
    return path


def replay_args(trace: Path, *, target: str | None = None, virtual: bool = True, extra: list[str] | None = None) -> list[str]:
    args = [str(trace), "--target", target or sim_target(), "--model", "llama-3-8b", "--slo", SLO, "--seed", "1"]
    if virtual:
        args.append("--virtual")
    return args + list(extra or [])


def replay(trace: Path, out: Path, *, target: str | None = None, virtual: bool = True, extra: list[str] | None = None) -> Path:
    """`slogate replay TRACE … --out OUT --quiet`; returns OUT (asserts it succeeded)."""
    args = replay_args(trace, target=target, virtual=virtual, extra=extra)
    status = slogate(["replay", *args, "--out", str(out), "--quiet"])
    assert status == 0, f"slogate replay exited {status}"
    assert (out / "results.json").is_file()
    return out


def test_runs_are_real_and_the_step_is_constant(tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "t.jsonl.zst", rate=20, seconds=3)
    run = replay(trace, tmp_path / "run")
    s = load(run).summary
    assert s.requests == 60 and s.failed == 0 and s.output_token_drift == 0
    assert s.slo_attainment == 1.0  # 20 req/s is well under the capacity: no queueing
    assert s.tpot_s.p50 == pytest.approx(step_s(), rel=0.02)  # one token per step
    assert (run / "requests.jsonl.zst").is_file()
