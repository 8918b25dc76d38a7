"""Capture: seeded sampling, salt file creation (0600), and records written by the real writer
thread with prefix hash ids computed off the caller's thread."""

from __future__ import annotations

import stat

from slogate.gateway.capture import Capture, perf_epoch
from slogate.gateway.config import build_config
from slogate.traces.reader import read_trace
from slogate.traces.record import RequestRecord


def _capture(tmp_path, **trace) -> Capture:
    cfg = build_config({"upstreams": ["http://127.0.0.1:1"], "trace": {"dir": str(tmp_path / "t"), **trace}})
    start_ns, start_unix = perf_epoch()
    return Capture(cfg, start_ns=start_ns, start_unix=start_unix, config_digest="b2:test")


def _run(cap: Capture, n: int) -> list[RequestRecord]:
    cap.start()
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 600}]}
    for i in range(n):
        cap.submit(RequestRecord(t=float(i), model="m", output_tokens=i, chunk_times=[0.1, 0.2]), body)
    cap.close()
    return read_trace(cap.writer.config.directory).records


def test_sampling_is_seeded_and_about_right(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "s")
    a = _run(_capture(tmp_path / "a", sample=0.25, seed=42), 2000)
    b = _run(_capture(tmp_path / "b", sample=0.25, seed=42), 2000)
    assert 400 < len(a) < 600
    assert [r.output_tokens for r in a] == [r.output_tokens for r in b]


def test_records_get_hash_ids_and_no_chunk_times(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "s")
    cap = _capture(tmp_path)
    records = _run(cap, 3)
    assert len(records) == 3 and cap.counts() == (3, 0)
    assert all(r.hash_ids and len(r.hash_ids) == 3 for r in records)  # 600+ prompt bytes / 256-byte blocks
    assert len({tuple(r.hash_ids) for r in records}) == 1
    assert all(r.chunk_times is None for r in records)


def test_salt_file_is_created_0600(tmp_path, monkeypatch):
    monkeypatch.delenv("SLOGATE_TRACE_SALT", raising=False)
    salt = tmp_path / "secret" / "salt"
    cap = _capture(tmp_path, salt_file=str(salt))
    assert salt.exists() and stat.S_IMODE(salt.stat().st_mode) == 0o600
    header_salt_id = cap.writer.header.salt_id
    assert header_salt_id and salt.read_bytes().hex() not in header_salt_id
    cap2 = _capture(tmp_path, salt_file=str(salt))  # the same salt on restart: the same id
    assert cap2.writer.header.salt_id == header_salt_id
