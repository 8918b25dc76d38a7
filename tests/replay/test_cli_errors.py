"""Bad input to `slogate replay` / `slogate merge`: one clear line on stderr, exit status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.replay.conftest import AZURE
from tests.servers import REPO, free_port

# not `-m traces.cli`: run as __main__ its UsageError is another class than the one modules raise
SLOGATE = [sys.executable, "-c", "import sys; from slogate.cli import main; sys.exit(main())"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SLOGATE, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=60)


def one_line_error(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_trace(tmp_path) -> None:
    one_line_error(run("replay", str(tmp_path / "nope.csv"), "--target", "http://127.0.0.1:9"), "no such trace file")


def test_unknown_format(tmp_path) -> None:
    bad = tmp_path / "trace.bin"
    bad.write_bytes(b"\x00\x01garbage")
    one_line_error(run("replay", str(bad), "--target", "http://127.0.0.1:9"), "trace format")


def test_unreachable_target() -> None:
    port = free_port()
    one_line_error(run("replay", str(AZURE), "--max-requests", "3", "--target", f"http://127.0.0.1:{port}"),
                   f"cannot reach http://127.0.0.1:{port}: connection refused; is the server running?")


@pytest.mark.parametrize(("args", "needle"), [
    (["--synthetic", "zipf:rate=3"], "unknown synthetic profile"),
    (["--synthetic", "poisson:rate=3", "--input-tokens", "normal:3"], "unknown input length distribution"),
    ([str(AZURE), "--window", "600"], "bad --window"),
    ([str(AZURE), "--shard", "3/3"], "bad --shard"),
    ([str(AZURE), "--slo", "ttft=fast"], "bad SLO ttft"),
    ([str(AZURE), "--window", "9000:9100"], "workload is empty"),
    (["--synthetic", "poisson:rate=3", "--force-output", "magic"], "bad --force-output"),
    ([], "give a TRACE file or --synthetic"),
    # the client frames its requests itself: a Content-Length option failed every request
    (["--synthetic", "poisson:rate=3", "--header", "Content-Length:5"], "the replay writes Content-Length itself"),
    (["--synthetic", "poisson:rate=3", "--header", "X Bad:1"], "bad --header 'X Bad': not a header name"),
    (["--synthetic", "poisson:rate=3", "--session-header", "Content-Length"], "bad --session-header 'Content-Length'"),
    (["--synthetic", "poisson:rate=3", "--session-header", "host"], "the replay sets host itself"),
    # a virtual run has no HTTP request for a fault to act on: error_rate=1 gave 100 % attainment
    (["--synthetic", "poisson:rate=3", "--target", "sim:h100-sxm/llama-3-8b?fault=error_rate=1", "--virtual"],
     "sim faults act on HTTP requests"),
    # the sim's argparse usage text came first, then the error
    (["--synthetic", "poisson:rate=3", "--target", "sim:h100-sxm/llama-3-8b?tp=x", "--virtual"],
     "bad sim option in --target: argument --tp: invalid int value: 'x'"),
])
def test_bad_options(args: list[str], needle: str) -> None:
    target = [] if "--target" in args else ["--target", "http://127.0.0.1:9"]
    one_line_error(run("replay", *args, *target), needle)


def test_an_unknown_tokenizer_is_no_error_where_no_text_is_tokenized(tmp_path) -> None:
    p = run("replay", "--synthetic", "poisson:rate=3", "--max-requests", "3", "--target", "sim:h100-sxm/llama-3-8b",
            "--virtual", "--tokenizer", "x", "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "out" / "results.json").exists()


def test_virtual_needs_a_sim_target() -> None:
    one_line_error(run("replay", "--synthetic", "poisson:rate=3", "--target", "http://127.0.0.1:9", "--virtual"),
                   "--virtual needs a simulated target")


def test_start_at_in_the_past() -> None:
    one_line_error(run("replay", "--synthetic", "poisson:rate=3", "--duration", "2", "--start-at", "1000",
                       "--target", "sim:h100-sxm/llama-3-8b?timing=constant"), "--start-at 1000 is in the past")


def test_merge_bad_dir(tmp_path) -> None:
    one_line_error(run("merge", str(tmp_path), "-o", str(tmp_path / "m")), "not a replay result directory")


def test_missing_required_option_is_one_line() -> None:
    one_line_error(run("replay", str(AZURE)), "required: --target")


def test_a_host_header_option_replaces_the_targets() -> None:
    """`--header Host:svc.example` (a service behind an ingress reached by address) is the request's one
    Host header; it was silently dropped."""
    from slogate.replay.http import Pool

    data = Pool("http://127.0.0.1:9", {"Host": "svc.example", "X-Tenant": "a"})._data("/v1/completions", b"{}")
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    assert head.count(b"\r\nhost:") == 1 and b"\r\nhost: svc.example" in head and b"x-tenant: a" in head
    default = Pool("http://127.0.0.1:9", {})._data("/v1/completions", b"{}").lower()
    assert b"\r\nhost: 127.0.0.1:9\r\n" in default
