"""The simulator's compiled build (`make compile`, slogate/native.py): in use where it was built,
the very same results as pure Python, and never used once one of its sources changed since the build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import slogate.replay.sim as sim
from slogate import native

REPO = Path(__file__).resolve().parents[2]

# Four virtual runs of bundled traces through every path of the compiled modules: V1 with prefix
# caching, V0's padded prefill batches, a small KV cache that preempts, int4 at a crawl (coalesced
# decode runs); a digest of every TTFT and chunk time, and the engine counters.
DIGEST = r"""
import hashlib, json, struct, sys
import msgspec
import slogate.replay.sim as sim
from slogate.replay import workload as wl
from slogate.replay.cli.plan import build_parser, workload_from
from slogate.replay.run import ReplayOptions, replay_virtual
from slogate.replay.sim import engine, kvcache, scheduler, steptime

def workload(name):
    ns = build_parser().parse_args([f"{sys.argv[1]}/{name}", "--slo", "ttft=2,tpot=0.1", "--candidates",
                                    "h100-sxm/llama-3-8b", "--window", "0:300"])
    return workload_from(ns)[0]

out = {"build": sim.BUILD, "files": [m.__file__ for m in (engine, kvcache, scheduler, steptime)], "runs": []}
for trace, target, speed in [("mooncake_conversation_10min.jsonl", "sim:h100-sxm/llama-3-8b", 1.0),
                             ("azure_conv_10min.csv", "sim:a100-80g/opt-13b?scheduler=v0", 0.5),
                             ("azure_conv_10min.csv", "sim:a100-80g/llama-3-8b?max_num_seqs=64&kv_blocks=600", 1.5),
                             ("azure_conv_10min.csv", "sim:l4/llama-3-8b?dtype=int4", 0.05),
                             ("azure_conv_10min.csv",  # host floor: the host-bound step counter
                              "sim:h100-sxm/llama-3-8b?tp=4&host_step_ms=6&host_seq_us=60&host_kv_ns=30", 0.5)]:
    base = workload(trace)
    w = msgspec.structs.replace(base, requests=wl.speed(base.requests, speed))
    res = replay_virtual(w, ReplayOptions(target=target, virtual=True, endpoint="completions"))
    h = hashlib.blake2b(digest_size=8)
    for r in res.records:
        h.update(struct.pack("<d", -1.0 if r.ttft is None else r.ttft))
        h.update(struct.pack(f"<{len(r.chunk_times or ())}d", *(r.chunk_times or ())))
    stats = res.sim_stats or {}
    out["runs"].append({"target": target, "digest": h.hexdigest(), "records": len(res.records),
                        "preemptions": stats.get("preemptions"), "prefix_hits": stats.get("prefix_hits_tokens"),
                        "host_bound_steps": stats.get("host_bound_steps")})
print(json.dumps(out))
"""


def _run(code: str, *args: str, cwd: Path, pythonpath: Path | None = None, pure: bool = False
         ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SLOGATE_PURE", "PYTHONPATH")}
    if pure:
        env["SLOGATE_PURE"] = "1"
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=240, check=False)


def test_the_compiled_build_is_what_runs_here():
    """`make test` builds it (make compile): the suite runs the compiled simulator."""
    assert sim.BUILD == "mypyc", "the simulator is not compiled here: run `make compile` (see the Makefile)"
    from slogate.replay.sim import engine, kvcache, scheduler, steptime

    for module in (engine, kvcache, scheduler, steptime):
        assert module.__file__ is not None and module.__file__.endswith(".so"), module.__file__
    assert native.stale(native.SIM) is None


def test_compiled_and_pure_python_give_the_very_same_runs(tmp_path):
    sample = str(REPO / "traces" / "samples")
    compiled = _run(DIGEST, sample, cwd=tmp_path)
    pure = _run(DIGEST, sample, cwd=tmp_path, pure=True)
    assert compiled.returncode == 0, compiled.stderr[-2000:]
    assert pure.returncode == 0, pure.stderr[-2000:]
    a, b = json.loads(compiled.stdout), json.loads(pure.stdout)
    assert a["build"] == "mypyc" and all(f.endswith(".so") for f in a["files"])
    assert b["build"] == "python" and all(f.endswith(".py") for f in b["files"])
    assert a["runs"] == b["runs"]
    by_target = {r["target"]: r for r in a["runs"]}
    assert by_target["sim:a100-80g/llama-3-8b?max_num_seqs=64&kv_blocks=600"]["preemptions"] > 0  # the path ran
    assert by_target["sim:h100-sxm/llama-3-8b"]["prefix_hits"] > 0
    assert all((r["host_bound_steps"] > 0) == ("host_step_ms" in r["target"]) for r in a["runs"])
    assert all(r["records"] > 500 for r in a["runs"])


GATEWAY_PROBE = r"""
import slogate
from slogate.gateway import relay
print(slogate.GATEWAY_BUILD, "mypyc" if relay.__file__.endswith(".so") else "python")
"""

PROBE = r"""
import slogate.replay.sim as sim
from slogate.replay.sim import scheduler
from slogate.replay.sim.engine import SimConfig, SimRequest, simulate
out = simulate([SimRequest(arrival=0.01 * i, prompt_tokens=40 + i, output_tokens=20) for i in range(8)],
               SimConfig(gpu="h100-sxm", model="llama-3-8b"))
print(sim.BUILD, scheduler.__file__, round(sum(r.e2e for r in out), 9))
"""


def test_a_source_changed_since_the_build_is_never_shadowed(tmp_path):
    """A copy of the tree with its build: used as built; with a compiled module the build no longer
    makes, after an edit, or without its stamp every compiled module loads from its .py, with a
    warning that says why and how to rebuild."""
    pkg = tmp_path / "slogate"
    shutil.copytree(REPO / "slogate", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("replay", "traces", "gateway"):
        shutil.copytree(REPO / folder, pkg / folder, ignore=shutil.ignore_patterns("__pycache__"))
    sim_dir = pkg / "replay" / "sim"
    assert any(sim_dir.glob("_native__mypyc.*")), "no compiled build to copy: run `make compile`"

    built = _run(PROBE, cwd=tmp_path, pythonpath=tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    build, path, e2e = built.stdout.split()
    assert build == "mypyc" and path.startswith(str(sim_dir)) and path.endswith(".so")
    assert "stale" not in built.stderr

    extra = sim_dir / next(sim_dir.glob("kvcache.*.so")).name.replace("kvcache", "records")
    shutil.copy2(next(sim_dir.glob("kvcache.*.so")), extra)  # a module an older build compiled, since dropped
    leftover = _run(PROBE, cwd=tmp_path, pythonpath=tmp_path)
    assert leftover.returncode == 0, leftover.stderr[-2000:]
    assert leftover.stdout.split()[0] == "python"
    assert "it holds engine, kvcache, records, scheduler, steptime" in leftover.stderr
    extra.unlink()

    with (sim_dir / "scheduler.py").open("a") as f:
        f.write("\n# an edit after the build\n")
    edited = _run(PROBE, cwd=tmp_path, pythonpath=tmp_path)
    assert edited.returncode == 0, edited.stderr[-2000:]
    build2, path2, e2e2 = edited.stdout.split()
    assert (build2, path2) == ("python", str(sim_dir / "scheduler.py"))
    assert e2e2 == e2e  # the pure modules run, and give the same answer
    assert "compiled simulator is stale (scheduler.py changed since it was compiled)" in edited.stderr
    assert "make compile" in edited.stderr

    (sim_dir / "_native.json").unlink()
    unstamped = _run(PROBE, cwd=tmp_path, pythonpath=tmp_path)
    assert unstamped.returncode == 0, unstamped.stderr[-2000:]
    assert unstamped.stdout.split()[0] == "python"
    assert "build stamp _native.json is missing" in unstamped.stderr

    # the gateway's group, the same way: an edit of one of its modules (a traces module here) runs them all pure
    gateway = _run(GATEWAY_PROBE, cwd=tmp_path, pythonpath=tmp_path)
    assert gateway.returncode == 0 and gateway.stdout.split() == ["mypyc", "mypyc"], gateway.stdout + gateway.stderr
    with (pkg / "traces" / "observer.py").open("a") as f:
        f.write("\n# an edit after the build\n")
    gateway = _run(GATEWAY_PROBE, cwd=tmp_path, pythonpath=tmp_path)
    assert gateway.returncode == 0 and gateway.stdout.split() == ["python", "python"], gateway.stdout + gateway.stderr
    assert "compiled gateway is stale (observer.py changed since it was compiled)" in gateway.stderr


def test_a_checkout_without_the_install_says_how_to_install(tmp_path):
    """`import slogate` from a bare checkout (no `make install`: the gateway's and replay's packages are
    mapped by the install) names the fix instead of failing an assertion."""
    env = {k: v for k, v in os.environ.items() if k not in ("SLOGATE_PURE", "PYTHONPATH")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-S", "-c", "import slogate"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"ImportError: slogate: slogate.gateway is not installed in {sys.executable}: run `make install` "
        "(or `pip install -e .`) and use that Python"), done.stderr
