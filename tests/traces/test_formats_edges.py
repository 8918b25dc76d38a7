"""Public trace formats at their edges, through the real `slogate trace` / `slogate replay` CLI in a
subprocess: a bad file is one line naming it and the fix (exit 2, never a traceback); an odd but
good one (byte-order mark, padded CSV header) loads like the plain file."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

_RUN = "import sys; from slogate.cli import main; sys.exit(main(sys.argv[1:]))"
BOM = "\ufeff"
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.0000000,10,5\n"
BURSTGPT = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,230,1317,Conversation log\n")
MOONCAKE_ROW = '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n'
AGENTIC = '{"block_size": 64, "hash_id_scope": "local", "requests": [%s]}'
TURN = '{"t": %s, "type": "n", "in": %d, "out": 5, "hash_ids": [1], "think_time": %s, "api_time": 1.0}'


def slogate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _RUN, *map(str, args)], capture_output=True, text=True, timeout=60)


def one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if "RuntimeWarning" not in ln and "from slogate" not in ln]
    assert len(lines) == 1 and ": error:" in lines[0], proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def stats(path: Path) -> dict:
    proc = slogate("trace", "stats", path, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_cut_gzip_is_one_line_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(gzip.compress((MOONCAKE_ROW * 2000).encode())[:500])
    for command in (("trace", "stats"), ("trace", "head")):
        one_line_error(slogate(*command, path), str(path), "gzip", "cut or corrupt")
    proc = slogate("trace", "validate", path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "cut or corrupt" in proc.stdout


@pytest.mark.parametrize(("name", "text", "requests"), [
    ("azure.csv", AZURE, 2),
    ("burstgpt.csv", BURSTGPT, 2),
    ("mooncake.jsonl", MOONCAKE_ROW * 3, 3),
    ("agentic.json", AGENTIC % TURN % (0, 10, 0), 1),
])
def test_a_byte_order_mark_loads_like_the_plain_file(tmp_path: Path, name: str, text: str, requests: int) -> None:
    plain, marked = tmp_path / f"plain-{name}", tmp_path / f"bom-{name}"
    plain.write_text(text, encoding="utf-8")
    marked.write_text(BOM + text, encoding="utf-8")
    assert stats(marked) == stats(plain) and stats(marked)["requests"] == requests


def test_azure_header_padded_with_spaces_loads(tmp_path: Path) -> None:
    path = tmp_path / "padded.csv"
    path.write_text("TIMESTAMP, ContextTokens, GeneratedTokens\r\n2023-11-16 18:15:46.6805900, 374, 44\r\n")
    data = stats(path)
    assert data["requests"] == 1 and data["input_tokens"]["mean"] == 374


def test_azure_timestamp_with_non_ascii_digits_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fullwidth.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.680590\uff10,374,44\n")
    one_line_error(slogate("trace", "stats", path), str(path), "line 2", "expected TIMESTAMP like")


@pytest.mark.parametrize(("body", "needles"), [
    ('{"t": 0, "type": "tool", "in": 10, "out": 5}', ("requests[0]", "bad type 'tool'", '"subagent"')),
    ('{"t": 0, "type": "n", "out": 5}', ("requests[0]", 'no "in"')),
    ('{"t": 0, "type": "subagent", "requests": [{"t": 1, "type": "n", "in": 3}]}', ("requests[0].requests[0]", 'no "out"')),
])
def test_agentic_entries_that_are_not_requests_are_named(tmp_path: Path, body: str, needles: tuple[str, ...]) -> None:
    path = tmp_path / "s.json"
    path.write_text(AGENTIC % body)
    one_line_error(slogate("trace", "stats", path), str(path), *needles)


def test_agentic_block_size_must_be_positive(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text((AGENTIC % TURN % (0, 10, 0)).replace('"block_size": 64', '"block_size": 0'))
    one_line_error(slogate("trace", "stats", path), str(path), "bad block_size 0")


def test_agentic_malformed_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"block_size": 64, "hash_id_scope": "local",\n "requests": [\n {"t": 0, "in": NaN}]}')
    one_line_error(slogate("trace", "stats", path), str(path), "line 3")


@pytest.mark.parametrize(("think", "needle"), [("1e12", "think=1e+12 s"), ("-3", "think=-3.0")])
def test_agentic_implausible_think_time_is_refused(tmp_path: Path, think: str, needle: str) -> None:
    """A negative think time, or one of 31,700 years (ms read as s), is bad data: validate names it and
    a replay refuses it instead of clamping it to 0 or waiting forever for the next turn."""
    path = tmp_path / "s.json"
    path.write_text(AGENTIC % f"{TURN % (0, 10, 0)}, {TURN % (2, 20, think)}")
    proc = slogate("trace", "validate", path)
    assert proc.returncode == 1 and f"record 2: bad {needle}" in proc.stdout, proc.stdout
    one_line_error(slogate("replay", path, "--target", "sim:h100-sxm/llama-3-8b", "--virtual", "--quiet",
                           "--out", tmp_path / "run"), str(path), needle)
    assert not (tmp_path / "run").exists()


def test_multi_turn_mooncake_round_trip_keeps_sessions(tmp_path: Path) -> None:
    """AIPerf's multi-turn Mooncake rows (session_id, delay) → slogate → Mooncake come back byte for byte,
    sessions and think times included (they were dropped: every row written as a lone request)."""
    src = tmp_path / "multi.jsonl"
    src.write_text('{"session_id": "s1", "timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
                   '{"session_id": "s2", "timestamp": 1500, "input_length": 100, "output_length": 5, "hash_ids": [7]}\n'
                   '{"session_id": "s1", "delay": 2000, "input_length": 1200, "output_length": 5, "hash_ids": [1, 2, 3]}\n')
    mid, back = tmp_path / "multi.jsonl.zst", tmp_path / "back.jsonl"
    assert slogate("trace", "convert", src, mid).returncode == 0
    assert slogate("trace", "convert", mid, back).returncode == 0
    assert back.read_text() == src.read_text()
    sessions = stats(back)["sessions"]
    assert sessions["sessions"] == 2 and sessions["think_s"]["mean"] == 2.0
