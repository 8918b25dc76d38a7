"""`slogate compare --repeat N runs/a/run-{1..N} runs/b/run-{1..N}` (the layout `replay --repeat N` writes)
names each side after the directory holding its repeats (`a`, `b`), as `slogate report runs/a runs/b`
does; it named them after their first repeat, `run-1` and `run-1#2`, so a reader could not tell the
baseline from the candidate. Real virtual-time replays on the sim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from tests.replay.conftest import AZURE


def _repeats(out: Path, gpu: str) -> list[str]:
    assert slogate(["replay", str(AZURE), "--window", "0:20", "--target", f"sim:{gpu}/llama-3-8b?jitter=0.05",
                    "--virtual", "--repeat", "2", "--quiet", "--out", str(out)]) == 0
    return [str(out / "run-1"), str(out / "run-2")]


def test_sides_are_named_after_their_repeats_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a100, h100 = _repeats(tmp_path / "a100", "a100-80g"), _repeats(tmp_path / "h100", "h100-sxm")
    capsys.readouterr()
    assert slogate(["compare", "--repeat", "2", *a100, *h100, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["baseline"] == "a100" and [s["name"] for s in data["sides"]] == ["a100", "h100"]
    assert slogate(["compare", "--repeat", "2", *a100, *h100]) == 0
    out = capsys.readouterr().out
    assert "a100 (baseline)" in out and "run-1" not in out.splitlines()[0]
    # repeats given from one folder (runs/a1 runs/a2 runs/b1 runs/b2) keep their own names
    flat = tmp_path / "flat"
    flat.mkdir()
    for src, name in zip([*a100, *h100], ["a1", "a2", "b1", "b2"], strict=True):
        Path(src).rename(flat / name)
    assert slogate(["compare", "--repeat", "2", *(str(flat / n) for n in ("a1", "a2", "b1", "b2")), "--json"]) == 0
    assert [s["name"] for s in json.loads(capsys.readouterr().out)["sides"]] == ["a1", "b1"]
