"""The vLLM container's preStop hook (deploy/kubernetes/base/deployment.yaml) keeps vLLM up until the
gateway sidecar has drained its in-flight streams and exited.

Real processes: the simulator as vLLM, `slogate gateway` in front of it, and the hook's own Python
script, taken from the manifest with the pod's ports mapped to free ones. The gateway gets SIGTERM
while a stream runs (as after its own preStop sleep); the hook must still be waiting when the
gateway exits, or kubelet would SIGTERM vLLM under the draining stream.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.deploy.deployfiles import KUBE, load_docs
from tests.realservers import start_gateway
from tests.servers import free_port
from tests.simserver import start_sim

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

TOKENS, ITL_MS = 160, 50  # an 8 s stream: longer than the hook's initial 5 s sleep


def _pod() -> dict:
    deploy = next(d for d in load_docs(KUBE / "base" / "deployment.yaml") if d["kind"] == "Deployment")
    return {c["name"]: c for c in deploy["spec"]["template"]["spec"]["containers"]}


def _vllm_pre_stop(ports: dict[int, int]) -> list[str]:
    """The vLLM preStop command with the gateway container's ports replaced (pod port → test port)."""
    command = list(_pod()["vllm"]["lifecycle"]["preStop"]["exec"]["command"])
    assert command[:2] == ["python3", "-c"], command
    script = command[2]
    watched = {int(p) for p in re.findall(r'\("127\.0\.0\.1",\s*(\d+)\)', script)}
    assert watched and watched <= set(ports), f"the hook watches {watched}, not a port of the gateway container"
    for pod_port, port in ports.items():
        script = re.sub(rf'(\("127\.0\.0\.1",\s*){pod_port}\)', rf"\g<1>{port})", script)
    return [sys.executable, "-c", script]


def test_vllm_outlives_the_draining_gateway() -> None:
    gw_ports = {p["name"]: p["containerPort"] for p in _pod()["slogate"]["ports"]}
    listen, admin = free_port(), free_port()
    hook = _vllm_pre_stop({gw_ports["http"]: listen, gw_ports["admin"]: admin})
    with (
        start_sim(timing="constant", ttft_ms=20, itl_ms=ITL_MS) as sim,
        start_gateway(sim.url, port=listen, extra_args=["--admin-listen", f"127.0.0.1:{admin}",
                                                        "--shutdown-grace", "30"]) as gw,
    ):
        model = json.load(urllib.request.urlopen(sim.url + "/v1/models", timeout=5))["data"][0]["id"]
        result: dict[str, object] = {}

        def stream() -> None:
            body = {"model": model, "prompt": "hi", "max_tokens": TOKENS, "stream": True, "ignore_eos": True}
            req = urllib.request.Request(gw.url + "/v1/completions", json.dumps(body).encode(),
                                         {"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                result["body"] = resp.read().decode()
            result["end"] = time.monotonic()

        client = threading.Thread(target=stream)
        client.start()
        deadline = time.monotonic() + 10
        while "slogate_inflight_requests{" not in _metrics(gw.admin_url) and time.monotonic() < deadline:
            time.sleep(0.05)  # the stream is in flight
        # Kubelet runs both preStop hooks at once; the gateway's (sleep 10) is shortened to nothing here.
        hook_proc = subprocess.Popen(hook)
        try:
            gw.proc.send_signal(signal.SIGTERM)
            gw.proc.wait(timeout=30)
            gateway_exit = time.monotonic()
            hook_done_early = hook_proc.poll() is not None
            hook_proc.wait(timeout=10)
            hook_exit = time.monotonic()
        finally:
            if hook_proc.poll() is None:
                hook_proc.kill()
                hook_proc.wait()
        client.join(timeout=30)
        assert gw.proc.returncode == 0
        body = str(result.get("body", ""))
        assert body.rstrip().endswith("data: [DONE]") and '"shutdown"' not in body, body[-300:]
        assert not hook_done_early, "vLLM's preStop returned while the gateway was still draining a stream"
        assert hook_exit - gateway_exit < 5, "vLLM's preStop kept waiting after the gateway exited"


def _metrics(admin_url: str) -> str:
    text = urllib.request.urlopen(admin_url + "/metrics", timeout=5).read().decode()
    return "\n".join(line for line in text.splitlines()
                     if line.startswith("slogate_inflight_requests{") and not line.endswith(" 0.0"))
