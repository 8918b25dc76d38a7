"""`--timing profile DIR`: Vidur's published per-operator profile (Llama-2-7B on A100) drives the simulator."""

from __future__ import annotations

import csv
import itertools
import math
import statistics
import time
from pathlib import Path

import aiohttp
import pytest

from slogate.replay.sim.catalog import find_gpu, find_model
from slogate.replay.sim.options import configure
from slogate.replay.sim.vidur import VidurSteps, tables
from slogate.traces.usage import UsageError
from tests.sim.test_cli import slogate

VIDUR = Path(__file__).resolve().parents[1] / "bench" / "ground_truth" / "vidur_a100_llama2_7b"
LLAMA2 = find_model("llama-2-7b")


def _median(row: dict[str, str], op: str) -> float:
    v = row[f"time_stats.{op}.median"]
    return float(v) if v else 0.0


def _csv_tp(name: str, tp: str) -> list[dict[str, str]]:
    with (VIDUR / name).open() as f:
        return [r for r in csv.DictReader(f) if r["num_tensor_parallel_workers"] == tp]


def _csv(name: str) -> list[dict[str, str]]:
    return _csv_tp(name, "1")


LAYER = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm", "mlp_up_proj",
         "mlp_act", "mlp_down_proj", "add")


def _by_hand(tokens: int, attention_rows: list[dict[str, str]], kernel: str) -> float:
    """A profiled step summed from the two CSVs: the embedding once, then 32 layers of norms, projections,
    rotary, MLP, residual add, and the attention kernel with its reshapes."""
    mlp = [r for r in _csv("mlp.csv") if int(r["num_tokens"]) == tokens]
    layer = statistics.fmean(sum(_median(r, op) for op in LAYER) for r in mlp)
    attn = statistics.fmean(sum(_median(r, op) for op in ("attn_input_reshape", kernel, "attn_output_reshape"))
                            for r in attention_rows)
    return statistics.fmean(_median(r, "emb") for r in mlp) + 32 * (layer + attn)


def test_profiled_steps_are_the_sum_of_their_operations():
    """At every decode batch and prompt chunk that both CSVs profiled, the step is the hand sum (a shape
    profiled twice, such as context 1024, is the mean of the two); a decode at batch 1 streams ~13.5 GB of
    fp16 weights at ~1.5 TB/s: ~10 ms."""
    steps = VidurSteps(str(VIDUR), LLAMA2)
    tokens = {int(r["num_tokens"]) for r in _csv("mlp.csv")}
    checked = 0
    for r in _csv("attention.csv"):
        b, k, n = int(r["batch_size"]), int(r["kv_cache_size"]), int(r["prefill_chunk_size"])
        prefill = r["is_prefill"] == "True"
        if (n if prefill else b) not in tokens:
            continue
        same = [x for x in _csv("attention.csv") if (x["batch_size"], x["kv_cache_size"], x["prefill_chunk_size"],
                                                      x["is_prefill"]) == (r["batch_size"], r["kv_cache_size"],
                                                                           r["prefill_chunk_size"], r["is_prefill"])]
        if prefill:
            got = steps.step_ms(n, 1, k + n, n * (k + n / 2))
            want = _by_hand(n, same, "attn_prefill")
        else:
            got = steps.step_ms(b, b, b * (k + 1), b * (k + 0.5))
            want = _by_hand(b, same, "attn_decode")
        assert got == pytest.approx(want, rel=1e-9), r
        checked += 1
    assert checked > 100
    assert 9.0 < steps.step_ms(1, 1, 33, 32.5) < 10.5


def step_totals(seqs: list[tuple[int, int]]) -> tuple[int, int, int, float]:
    """A step's shape as the scheduler sums it from (new tokens, context) per sequence."""
    return (sum(n for n, _ in seqs), len(seqs), sum(c + n for n, c in seqs), sum(n * (c + n / 2) for n, c in seqs))


def test_a_mixed_step_is_its_prompt_chunk_plus_its_decode_batch():
    """V1 mixes one prompt chunk with the running decodes: the step's attention is the prefill call for that
    chunk at its context plus the decode call for the others at their mean context (recovered from the
    step's totals); with V0, a step of several prompts is one chunk of the same attention work."""
    steps = VidurSteps(str(VIDUR), LLAMA2)
    mixed = steps.attention_ms(*step_totals([(512, 256)] + [(1, 1024)] * 31))
    assert mixed == pytest.approx(steps.prefill.at(512, 256) + steps.decode.at(31, 1024), rel=1e-9)
    assert steps.attention_ms(*step_totals([(1, 300), (1, 500)])) == pytest.approx(steps.decode.at(2, 400), rel=1e-9)
    v0 = VidurSteps(str(VIDUR), LLAMA2, v0=True)
    three = v0.attention_ms(*step_totals([(256, 0)] * 3))
    assert three == pytest.approx(v0.prefill.at(math.sqrt(3) * 256, 0), rel=1e-9)
    assert steps.step_ms(*step_totals([(1, 2000)] * 64)) > 1.5 * steps.step_ms(*step_totals([(1, 200)] * 64))  # the KV read


async def _stream(http: aiohttp.ClientSession, url: str, words: int, tokens: int) -> tuple[list[float], int]:
    """One streamed completion: each token's arrival after the send (s), and the prompt's token count."""
    body = {"model": "llama-2-7b", "prompt": " ".join(["word"] * words), "max_tokens": tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    times: list[float] = []
    tail = b""
    async with http.post(url + "/v1/completions", json=body) as r:
        async for chunk in r.content.iter_any():
            times += [time.perf_counter() - t0] * chunk.count(b'"text":"')
            tail = (tail + chunk)[-4096:]
    return times, int(tail.split(b'"prompt_tokens":')[1].split(b",")[0])


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_a_sim_on_the_profile_streams_at_its_step_times(sim_server):
    """A real-clock `slogate sim --timing profile DIR`, one request at a time: a 500-token prompt's first
    token comes later than a 1-token prompt's by the profile's difference between the two prefill steps (the
    HTTP round trip cancels), and it decodes at the profile's batch-1 step. The roofline on the same GPU
    would give a 23 % larger difference and a 9 % longer decode step."""
    sim = sim_server(model="llama-2-7b", gpu="a100-80g", timing=("profile", str(VIDUR)), extra_args=["--jitter", "0"])
    p = VidurSteps(str(VIDUR), LLAMA2)
    async with aiohttp.ClientSession() as http:
        await _stream(http, sim.url, 1, 2)  # warm: the first request pays the connection
        short = [await _stream(http, sim.url, 1, 2) for _ in range(3)]
        times, n = await _stream(http, sim.url, 500, 60)
    m = short[0][1]
    ttft_short = statistics.median(t[0] for t, _ in short)
    assert len(times) == 60
    gap = p.step_ms(n, 1, n, n * n / 2) - p.step_ms(m, 1, m, m * m / 2)
    assert (times[0] - ttft_short) * 1e3 == pytest.approx(gap, rel=0.1), (times[0], ttft_short, gap)
    tpot = statistics.median(b - a for a, b in itertools.pairwise(times))
    assert tpot * 1e3 == pytest.approx(p.step_ms(1, 1, n + 30, n + 29.5), rel=0.05)


class _Seq:
    """A running request as the scheduler hands it to the step model: its tokens computed so far."""

    def __init__(self, num_computed: int) -> None:
        self.num_computed = num_computed


def test_the_engine_prices_each_sequence_and_agrees_with_the_totals():
    """The engine passes a step's sequences (`of_batch`): with at most one prompt chunk that is the very
    price the totals give; with two prompt chunks beside decodes, each kind is its own attention call
    (the totals would take one of the prompts for a decode)."""
    steps = VidurSteps(str(VIDUR), LLAMA2)
    one = [(512, 256)] + [(1, 1024)] * 31
    batch, tokens = [_Seq(c) for _, c in one], [n for n, _ in one]
    assert steps.of_batch(543, batch, tokens) * 1e3 == pytest.approx(steps.step_ms(*step_totals(one)), rel=1e-9)
    two = [(300, 0), (200, 100)] + [(1, 800)] * 30
    batch, tokens = [_Seq(c) for _, c in two], [n for n, _ in two]
    work = 300 * 150 + 200 * (100 + 100)
    want = steps.decode.at(30, 800) + steps.prefill.at(math.sqrt(2 * work), 0)
    assert steps.batch_attention_ms(batch, tokens) == pytest.approx(want, rel=1e-9)
    assert steps.of_batch(530, batch, tokens) * 1e3 == pytest.approx(steps._total_ms(530, want), rel=1e-9)


def test_tensor_parallel_steps_add_two_all_reduces_per_layer():
    """With --tp 2 the step is the TP-2 rows' operations plus, per layer, two all-reduces of the step's
    activations (tokens × 4096 × 2 bytes) from Vidur's network profile of one DGX A100 node; a 4096-token
    prompt moves 32 MiB, a size the profile measured."""
    with (VIDUR / "all_reduce.csv").open() as f:
        ar = next(float(r["time_stats.all_reduce.median"]) for r in csv.DictReader(f)
                  if (r["num_workers"], r["devices_per_node"], r["size"]) == ("2", "2", str(4096 * 4096 * 2)))
    mlp = [r for r in _csv_tp("mlp.csv", "2") if r["num_tokens"] == "4096"]
    attn = [r for r in _csv_tp("attention.csv", "2") if (r["is_prefill"], r["prefill_chunk_size"], r["kv_cache_size"])
            == ("True", "4096", "0")]
    assert mlp and attn
    layer = statistics.fmean(sum(_median(r, op) for op in LAYER) for r in mlp)
    kernel = statistics.fmean(sum(_median(r, op) for op in ("attn_input_reshape", "attn_prefill", "attn_output_reshape"))
                              for r in attn)
    want = statistics.fmean(_median(r, "emb") for r in mlp) + 32 * (layer + kernel + 2 * ar)
    tp2 = VidurSteps(str(VIDUR), LLAMA2, tp=2)
    assert tp2.step_ms(4096, 1, 4096, 4096 * 2048) == pytest.approx(want, rel=1e-9)
    one = VidurSteps(str(VIDUR), LLAMA2)
    assert tp2.step_ms(4096, 1, 4096, 4096 * 2048) < 0.75 * one.step_ms(4096, 1, 4096, 4096 * 2048)  # compute-bound: split


def test_the_a100_link_in_the_catalog_is_the_line_through_vidurs_all_reduce_profile():
    """The catalog's A100 all-reduce (fixed µs + ring bytes / GB/s, as steptime.py prices it) is the
    least-squares line through the shipped NCCL profile of a DGX A100 (TP 2 and 4): its source, checked."""
    xs, ys = [], []
    with (VIDUR / "all_reduce.csv").open() as f:
        for r in csv.DictReader(f):
            tp = int(r["num_workers"])
            if r["collective"] == "all_reduce" and int(r["devices_per_node"]) == tp in (2, 4):
                xs.append(2 * (tp - 1) / tp * int(r["size"]))  # ring bytes per GPU
                ys.append(float(r["time_stats.all_reduce.median"]) * 1e3)  # µs
    assert len(xs) == 56
    slope, intercept = statistics.linear_regression(xs, ys)
    for name in ("a100-80g", "a100-40g"):
        gpu = find_gpu(name)
        assert gpu.link_latency_us == pytest.approx(intercept, abs=0.5), intercept
        assert gpu.link_gb_s == pytest.approx(1e-3 / slope, rel=0.01), 1e-3 / slope


def test_the_profile_is_parsed_once_and_again_after_a_change(tmp_path):
    """Start-up check and replicas share one parse; a rewritten file is read again."""
    for name in ("mlp.csv", "attention.csv"):
        (tmp_path / name).write_bytes((VIDUR / name).read_bytes())
    a = VidurSteps(str(tmp_path), LLAMA2)
    b = VidurSteps(str(tmp_path), LLAMA2, seed=7)
    assert a.decode is b.decode and a.layer_ops is b.layer_ops
    first = tables(str(tmp_path), 1)
    rows = (tmp_path / "mlp.csv").read_text().splitlines()
    (tmp_path / "mlp.csv").write_text("\n".join(rows[:-1]) + "\n")  # one row fewer
    again = tables(str(tmp_path), 1)
    assert again is not first and again.layer_ops is not a.layer_ops


def test_a_profile_of_another_model_or_tp_is_refused_with_the_fix(tmp_path):
    p = slogate("--port", "1", "--timing", "profile", str(VIDUR), "--model", "llama-2-7b", "--tp", "8")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "no rows for --tp 8 in both tables (profiled: [1, 2, 4])" in p.stderr, p.stderr
    for name in ("mlp.csv", "attention.csv"):  # no all_reduce.csv beside them
        (tmp_path / name).write_bytes((VIDUR / name).read_bytes())
    p = slogate("--port", "1", "--timing", "profile", str(tmp_path), "--model", "llama-2-7b", "--tp", "2")
    assert p.returncode == 2 and "--tp 2 needs the all-reduce times of your node" in p.stderr, p.stderr
    p = slogate("--port", "1", "--timing", "profile", str(VIDUR), "--model", "llama-3-8b")  # 8 KV heads, not 32
    assert p.returncode == 2 and "n_kv_head 32" in p.stderr and "--model llama-3-8b has" in p.stderr, p.stderr
    with pytest.raises(UsageError, match=r"needs Vidur's mlp\.csv and attention\.csv"):
        configure(["--timing", "profile", str(VIDUR.parent)])
    # a timing cell that is not a time: the file and the cell are named, no traceback
    text = (VIDUR / "attention.csv").read_text()
    head, first, rest = text.split("\n", 2)
    col = head.split(",").index("time_stats.attn_decode.median")
    cells = first.split(",")
    cells[col] = "n/a"
    (tmp_path / "attention.csv").write_text("\n".join((head, ",".join(cells), rest)))
    p = slogate("--port", "1", "--timing", "profile", str(tmp_path), "--model", "llama-2-7b")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert f"{tmp_path / 'attention.csv'}: bad time_stats.attn_decode.median 'n/a'" in p.stderr, p.stderr


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_plan_takes_a_vidur_profile_through_a_sim_config(tmp_path):
    """`slogate plan` plans an engine whose `--config` TOML names the profile: the candidate fits and is
    planned on the profile's step times, not the roofline's."""
    import orjson

    from slogate.cli import main

    cfg = tmp_path / "vidur.toml"
    cfg.write_text(f'[sim]\ntiming = "profile"\nprofile = "{VIDUR}"\nmodel = "llama-2-7b"\ngpu = "a100-80g"\n')
    trace = Path(__file__).resolve().parents[2] / "traces" / "samples" / "burstgpt_sample.csv"
    out = tmp_path / "plan"
    assert main(["plan", str(trace), "--slo", "ttft=2,tpot=0.1", "--out", str(out),
                 "--candidates", f"a100-80g/llama-2-7b,a100-80g/llama-2-7b?config={cfg}"]) == 0
    roof, vidur = orjson.loads((out / "plan.json").read_bytes())["candidates"]
    assert roof["fits"] and vidur["fits"], (roof, vidur)
    assert vidur["goodput_tokens_per_s"] != roof["goodput_tokens_per_s"]
