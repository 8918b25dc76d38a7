"""The distributed-replay Job's shell scripts, run as local processes: 2 shards, the wait, the merge.

The scripts come verbatim from deploy/kubernetes/replay-job (the shared volume /work/ mapped to a
temporary directory, the pod env given by hand) and replay a small trace against a sim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.deploy.deployfiles import KUBE, load_docs
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(120)
SHARDS = 2
N_REQUESTS = 8


def _script(doc: dict, section: str, work: Path) -> str:
    script = doc["spec"]["template"]["spec"][section][0]["args"][0]
    return script.replace("/work/", f"{work}/")


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_replay_job_scripts_replay_shards_and_merge(tmp_path: Path) -> None:
    job = load_docs(KUBE / "replay-job" / "replay-job.yaml")[0]
    merge = load_docs(KUBE / "replay-job" / "merge-job.yaml")[0]
    (tmp_path / "trace").mkdir()
    trace = tmp_path / "trace" / "trace.jsonl"  # Mooncake format: ms timestamps, lengths, prefix blocks
    trace.write_text("".join(json.dumps({"timestamp": i * 150, "input_length": 64, "output_length": 8,
                                         "hash_ids": [i]}) + "\n" for i in range(N_REQUESTS)))
    bin_dir = str(Path(sys.executable).parent)  # where the `slogate` console script is installed
    with start_sim(timing="constant", ttft_ms=20, itl_ms=5) as sim:
        model = json.load(urllib.request.urlopen(sim.url + "/v1/models", timeout=5))["data"][0]["id"]
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SHARDS": str(SHARDS),
               "START_AT": str(int(time.time()) + 3), "TARGET_URL": sim.url, "MODEL": model, "TRACE": str(trace)}
        shards = [subprocess.Popen(["sh", "-c", _script(job, "containers", tmp_path)],
                                   env={**env, "JOB_COMPLETION_INDEX": str(i)},
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                  for i in range(SHARDS)]
        for p in shards:
            out, _ = p.communicate(timeout=60)
            assert p.returncode == 0, out
        wait = subprocess.run(["sh", "-c", _script(merge, "initContainers", tmp_path)], env=env,
                              capture_output=True, text=True, timeout=30)
        assert wait.returncode == 0 and wait.stdout.count("done") == SHARDS, wait.stdout + wait.stderr
        merged = subprocess.run(["sh", "-c", _script(merge, "containers", tmp_path)], env=env,
                                capture_output=True, text=True, timeout=60)
        assert merged.returncode == 0, merged.stdout + merged.stderr
    summary = json.loads((tmp_path / "results" / "merged" / "results.json").read_text())["summary"]
    assert summary["requests"] == N_REQUESTS and summary["failed"] == 0, summary
    for i in range(SHARDS):
        assert (tmp_path / "results" / f"shard-{i}" / ".done").is_file()
    assert (tmp_path / "results" / "merged" / "requests.jsonl.zst").is_file()
