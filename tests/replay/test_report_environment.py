"""Each environment field comes from the server where the server offers it, and is "not recorded"
otherwise: the sim's /version (over real HTTP), llama.cpp's /props and vLLM's `*_info` gauges (small
stand-in servers on 127.0.0.1 speaking those endpoints' documented shapes: no llama.cpp or vLLM here),
then --label; the report renders every unset field as "not recorded". And on one real HTTP run, every
environment row and the other three parts (load, metrics, conclusions) of its report, checked against
the run's own numbers."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from slogate.replay import report
from slogate.replay.outputs.html import ENV_ROWS
from slogate.replay.report_model import load_profile
from slogate.replay.results import Environment
from slogate.replay.sim.server import SIM_VERSION
from slogate.replay.target import Probe, apply_probe, probe
from tests.replay.test_compare_runs import make_trace, replay

LLAMA_PROPS = {"default_generation_settings": {"n_ctx": 4096, "temperature": 0.8}, "total_slots": 4,
               "model_path": "/models/gemma-3-270m-Q4_K_M.gguf", "chat_template": "…", "build_info": "b5123-abc1234"}
VLLM_METRICS = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
    'gpu_memory_utilization="0.9",num_gpu_blocks="27000",prefix_caching_hash_algo="builtin"} 1.0\n'
    'vllm:model_config_info{dtype="bfloat16",max_model_len="8192",tensor_parallel_size="2"} 1.0\n'
    "vllm:num_requests_running 0.0\n"
)


async def _serve(routes: dict[str, tuple[str, str]], owned_by: str) -> tuple[web.AppRunner, str]:
    app = web.Application()

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": owned_by}]})

    app.router.add_get("/v1/models", models)
    for path, (body, ctype) in routes.items():
        async def handler(_: web.Request, b: str = body, c: str = ctype) -> web.Response:
            return web.Response(text=b, content_type=c)

        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def probe_of(routes: dict[str, tuple[str, str]], owned_by: str) -> Probe:
    async def go() -> Probe:
        runner, url = await _serve(routes, owned_by)
        try:
            async with aiohttp.ClientSession() as session:
                return await probe(session, url, {})
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_llamacpp_props_fill_the_engine_fields() -> None:
    info = probe_of({"/props": (json.dumps(LLAMA_PROPS), "application/json")}, owned_by="llamacpp")
    env = apply_probe(Environment(labels={"gpu": "RTX-4090", "driver": "550.54"}), info)
    assert info.kind == "llamacpp"
    assert env.framework == "llama.cpp" and env.framework_version == "b5123-abc1234"
    assert env.engine["max_num_seqs"] == "4" and env.engine["n_ctx"] == "4096"
    assert env.engine["model_file"] == "gemma-3-270m-Q4_K_M.gguf"
    assert env.recorded_by["framework_version"] == "/props" and env.recorded_by["engine.max_num_seqs"] == "/props"
    # the server says nothing about the hardware: the labels fill it, the rest stays unrecorded
    assert env.gpu == "RTX-4090" and env.recorded_by["gpu"] == "label" and env.driver == "550.54"
    assert env.cuda is None and env.gpu_memory is None and "cuda" not in env.recorded_by


def test_vllm_info_gauges_fill_the_engine_flags() -> None:
    info = probe_of({"/version": ('{"version": "0.11.0"}', "application/json"),
                     "/metrics": (VLLM_METRICS, "text/plain")}, owned_by="vllm")
    env = apply_probe(Environment(labels={"framework": "ignored-the-server-said-it"}), info)
    assert info.kind == "vllm" and env.framework == "vllm" and env.framework_version == "0.11.0"
    assert env.recorded_by["framework"] == "/version"
    assert env.engine["enable_prefix_caching"] == "True" and env.engine["num_gpu_blocks"] == "27000"
    assert env.engine["tensor_parallel_size"] == "2" and env.gpu_count == 2 and env.precision == "bfloat16"
    assert env.recorded_by["engine.block_size"] == "/metrics vllm:cache_config_info"
    assert "prefix_caching_hash_algo" not in env.engine  # not an engine flag a reader needs
    assert env.gpu is None and env.driver is None


def test_a_server_that_says_nothing_leaves_every_field_unrecorded() -> None:
    info = probe_of({}, owned_by="someone")
    env = apply_probe(Environment(), info)
    assert info.kind == "unknown"
    assert all(getattr(env, f) is None for f in ("gpu", "gpu_count", "gpu_memory", "driver", "cuda", "framework",
                                                  "framework_version", "precision"))
    assert env.engine == {} and env.recorded_by == {}


def test_sim_over_http_states_its_version_and_config(tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "t.jsonl.zst", rate=20, seconds=1)
    run = replay(trace, tmp_path / "run", virtual=False)
    data = report.collect([run])
    env = data.runs[0].results.environment
    assert env.framework == "slogate-sim" and env.framework_version == SIM_VERSION
    assert env.recorded_by["framework_version"] == "/version"  # asked over HTTP, not assumed
    assert env.gpu == "H100-SXM" and env.recorded_by["gpu"] == "sim config"
    assert env.engine["max_num_seqs"] == "4" and env.gpu_memory == "80 GiB"
    html = report.build_html(data, plots=False)
    envsec = html[html.index('<section id="environment">'):html.index('<section id="load">')]
    for label in ("GPU", "GPU count", "GPU memory", "driver", "CUDA", "framework", "framework version", "precision",
                  "max_num_seqs", "token budget (max_num_batched_tokens)", "tensor parallel", "prefix caching",
                  "request timeout (s)", "retries", "warm-up", "seed"):
        assert f'<td class="k">{label}</td>' in envsec, label
    # nobody recorded the driver or CUDA for the sim: marked, not left out
    for label in ("driver", "CUDA"):
        row = envsec[envsec.index(f'<td class="k">{label}</td>'):].split("</tr>")[0]
        assert "not recorded" in row, label
    assert f"{SIM_VERSION}<span class=\"src\">/version</span>" in envsec


# Rows nobody states for the sim: it has no driver or CUDA, and this run gave no --label.
SIM_NOT_RECORDED = {"driver", "CUDA", "labels"}


def _rows(section: str) -> dict[str, str]:
    """label -> the run's cell (HTML) of the report's environment tables (one run)."""
    return dict(re.findall(r'<tr><td class="k">([^<]+)</td><td>(.*?)</td></tr>', section))


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_every_environment_row_and_the_four_parts_on_a_real_run(tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "t.jsonl.zst", rate=20, seconds=2)
    run = replay(trace, tmp_path / "run", virtual=False, extra=["--scrape-metrics", "0.2", "--cost-per-hour", "2"])
    data = report.collect([run])
    html = report.build_html(data, plots=False)
    part = {sid: html[html.index(f'<section id="{sid}">'):] for sid in ("environment", "load", "metrics", "conclusions")}
    part = {k: v[:v.index("</section>")] for k, v in part.items()}
    rows = _rows(part["environment"])
    labels = [label for _, group in ENV_ROWS for label, _ in group]
    assert set(labels) <= set(rows), set(labels) - set(rows)  # every field has a row: none is left out
    unrecorded = {label for label in labels if "not recorded" in rows[label]}
    assert unrecorded == SIM_NOT_RECORDED, unrecorded
    env = data.runs[0].results.environment
    # each hardware/engine value says who stated it (the server over HTTP, or the sim's config)
    for label, key in dict(ENV_ROWS)["hardware"] + dict(ENV_ROWS)["engine"]:
        if label not in unrecorded and key != "engine.*":
            assert '<span class="src">' in rows[label], label
    assert "/version" in rows["framework version"] and "/v1/models" in rows["model"]
    assert env.driver is None and env.cuda is None and not env.labels

    # with labels, the same fields are recorded, and say so
    labelled = replay(trace, tmp_path / "labelled", virtual=False,
                      extra=["--label", "driver=550.54", "--label", "cuda=12.4"])
    lrows = _rows(report.build_html(report.collect([labelled]), plots=False))
    assert lrows["driver"] == '550.54<span class="src">label</span>' and lrows["CUDA"].startswith("12.4")
    assert "not recorded" not in lrows["labels"]

    # load: the table row is the records' own profile
    lp = load_profile(data.runs[0].records)
    load_row = re.search(r'<tr><td class="k">run</td>(.*?)</tr>', part["load"]).group(1)
    cells = re.findall(r"<td>(.*?)</td>", load_row)
    assert cells[0] == str(lp.requests) == "40" and float(cells[2]) == pytest.approx(lp.mean_rps, rel=1e-3)
    assert cells[4].startswith(f"{lp.peak_minute_rps:.3g}")
    assert 'id="load-run"' in part["load"] and "workload:" in part["load"]
    # metrics: throughput beside goodput, latency percentiles, errors by class
    s = data.runs[0].results.summary
    for table in ('id="throughput"', 'id="latency"', 'id="errors"', 'id="telemetry"'):
        assert table in part["metrics"], table
    assert f"{s.slo_attainment:.1%}" in part["metrics"]
    # conclusions: one of each kind this run supports, each linking to a figure present on the page
    topics = re.findall(r'<span class="topic">([a-z]+)</span>', part["conclusions"])
    assert {"capacity", "binding", "cost", "trust"} <= set(topics), topics
    assert "$2/hour" in part["conclusions"] and "(client view" not in part["conclusions"]  # telemetry was scraped
    ids = set(re.findall(r'\bid="([^"]+)"', html))
    assert set(re.findall(r'href="#([^"]+)"', part["conclusions"])) <= ids
