"""Public formats: import/export roundtrips on the bundled samples, layouts, guessing, Mooncake export."""

from __future__ import annotations

import json

import pytest

from slogate.traces import formats, samples
from slogate.traces.anonymize import PrefixHasher
from slogate.traces.formats.mooncake import coarsen_factor
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.segments import TraceError

AZURE_2024 = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    "2024-05-10 00:00:00.009930+00:00,2162,5\r\n"
    "2024-05-10 00:00:00.017335+00:00,2399,6\r\n"
    "2024-05-10 00:00:01+00:00,76,15\r\n"
    "2024-05-10 23:59:59.929501+00:00,4725,8\r\n"
    "2024-05-11 00:00:00.000001+00:00,1,1\r\n"
)


def _via_slogate(tmp_path, src, ext: str, fmt: str | None = None):
    header, records = formats.load(src)
    mid = tmp_path / "mid.jsonl.zst"
    formats.save(records, mid, header=header)
    header2, records2 = formats.load(mid)
    out = tmp_path / f"out{ext}"
    formats.save(records2, out, fmt, header=header2)
    return out


@pytest.mark.parametrize("name", [samples.AZURE_CONV, samples.AZURE_CODE])
def test_azure_2023_roundtrip_is_byte_identical(tmp_path, name) -> None:
    src = samples.path(name)
    out = _via_slogate(tmp_path, src, ".csv")
    assert out.read_bytes() == src.read_bytes()
    header, records = formats.load(src)
    assert header.source == "import:azure-2023" and records[0].t < 1e-6


def test_azure_2024_layout_roundtrip(tmp_path) -> None:
    src = tmp_path / "AzureLLMInferenceTrace_code_1week.csv"
    src.write_text(AZURE_2024, newline="")
    header, records = formats.load(src)
    assert header.source == "import:azure-2024"
    assert [r.input_tokens for r in records] == [2162, 2399, 76, 4725, 1]
    assert records[2].t == pytest.approx(1.0 - 0.009930)
    assert _via_slogate(tmp_path, src, ".csv").read_bytes() == src.read_bytes()


def test_azure_layout_conversion_and_bad_rows(tmp_path) -> None:
    header, records = formats.load(samples.path(samples.AZURE_CONV))
    out = tmp_path / "x.csv"
    formats.save(records[:2], out, header=header, layout="2024")
    assert out.read_text().splitlines()[1] == "2023-11-16 18:15:46.680590+00:00,374,44"
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,2\nyesterday,1,2\n")
    with pytest.raises(TraceError, match="line 3"):
        formats.load(bad)


def test_mooncake_roundtrip_is_lossless(tmp_path) -> None:
    src = samples.path(samples.MOONCAKE_CONVERSATION)
    header, records = formats.load(src)
    assert (header.block_size, header.block_unit) == (512, "tokens")
    out = _via_slogate(tmp_path, src, ".jsonl")
    assert out.read_bytes() == src.read_bytes()
    first = json.loads(src.read_text().splitlines()[0])
    assert records[0].input_tokens == first["input_length"] and records[0].hash_ids == first["hash_ids"]


def test_mooncake_export_remaps_and_coarsens_byte_blocks(tmp_path) -> None:
    hasher = PrefixHasher(b"k" * 32)  # 256-byte blocks: 8 per 512-token Mooncake block
    assert coarsen_factor(256, "bytes") == 8 and coarsen_factor(64, "tokens") == 8
    shared = bytes(range(256)) * 40  # 10,240 bytes ≈ 2,560 tokens = 5 Mooncake blocks
    a = RequestRecord(t=0.0012, input_tokens=2600, output_tokens=10, hash_ids=hasher(shared + b"a" * 3000))
    b = RequestRecord(t=1.5, input_tokens=2600, output_tokens=20, hash_ids=hasher(shared + b"b" * 3000))
    c = RequestRecord(t=2.0, input_tokens=100, output_tokens=1)  # no hash ids: fresh blocks
    out = tmp_path / "m.jsonl"
    formats.save([a, b, c], out, header=TraceHeader(block_size=256, block_unit="bytes"))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["timestamp"] for r in rows] == [1, 1500, 2000]
    assert rows[0]["hash_ids"] == [0, 1, 2, 3, 4, 5]  # ceil(2600 / 512) = 6 blocks, small ints
    assert rows[1]["hash_ids"] == [0, 1, 2, 3, 4, 6]  # shares the 5 full blocks of the common prefix
    assert rows[2]["hash_ids"] == [7]
    assert set(rows[0]) == {"timestamp", "input_length", "output_length", "hash_ids"}


def test_burstgpt_failed_rows(tmp_path) -> None:
    header, records = formats.load(samples.path(samples.BURSTGPT))
    assert header.source == "import:burstgpt" and len(records) == 54
    failed = [r for r in records if r.output_tokens == 0]
    assert failed and all(r.status == 500 and r.error == "unknown" for r in failed)
    assert records[0].t == 5.0 and records[0].model == "ChatGPT" and records[0].input_tokens == 472
    with pytest.raises(formats.FormatError, match="not supported"):
        formats.save(records, tmp_path / "x.csv", "burstgpt")


def test_guess_format(tmp_path) -> None:
    assert formats.guess_format(samples.path(samples.AZURE_CONV)) == "azure"
    assert formats.guess_format(samples.path(samples.BURSTGPT)) == "burstgpt"
    assert formats.guess_format(samples.path(samples.MOONCAKE_CONVERSATION)) == "mooncake"
    seg = tmp_path / "s.jsonl.zst"
    formats.save([RequestRecord(t=0.0)], seg)
    assert formats.guess_format(seg) == "slogate" and formats.guess_format(tmp_path) == "slogate"
    for name, fmt in (("a.jsonl.zst", "slogate"), ("a.jsonl", "mooncake"), ("a.CSV", "azure")):
        assert formats.guess_format(tmp_path / name, for_output=True) == fmt
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(formats.FormatError, match="--from"):
        formats.guess_format(tmp_path / "notes.txt")
    with pytest.raises(formats.FormatError, match="unknown trace format 'xlsx'"):
        formats.load(seg, "xlsx")
