"""GatewayConfig: TOML + flags, and one clear error line naming the key for every bad value."""

from __future__ import annotations

import pytest

from slogate.gateway.cli import build_parser, overrides
from slogate.gateway.config import build_config, merge, read_toml
from slogate.traces.usage import UsageError

UP = {"upstreams": ["http://127.0.0.1:8000"]}


def cfg_from(toml: str, argv: list[str], tmp_path) -> object:
    path = tmp_path / "slogate.toml"
    path.write_text(toml)
    args = build_parser().parse_args(["--config", str(path), *argv])
    return build_config(merge(read_toml(path), overrides(args)))


def test_defaults_and_toml_and_flag_override(tmp_path):
    toml = """
[gateway]
listen = "127.0.0.1:9000"
upstreams = ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
slos = { interactive = "ttft=0.5,tpot=50ms" }
[gateway.timeouts]
idle = "30s"
ttfb = 10
[gateway.trace]
dir = "/tmp/x"
sample = 0.25
"""
    cfg = cfg_from(toml, ["--idle-timeout", "500ms", "--slo", "batch:e2e=60"], tmp_path)
    assert cfg.listen == "127.0.0.1:9000"
    assert len(cfg.upstreams) == 2
    assert cfg.timeouts.idle == pytest.approx(0.5)  # flag wins
    assert cfg.timeouts.ttfb == 10
    assert cfg.timeouts.connect == 5.0  # default
    assert cfg.trace.sample == 0.25
    assert cfg.slos == {"batch": "e2e=60"}  # flags replace the table
    assert cfg.inject_usage is True
    assert cfg.max_body_bytes == 32 << 20


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"timeouts": {"idle": "abc"}}, 'gateway.timeouts.idle (--idle-timeout): expected a positive number of seconds, got "abc"'),
        ({"timeouts": {"idle": -1}}, "gateway.timeouts.idle (--idle-timeout): expected a positive number of seconds, got -1"),
        ({"timeouts": {"bogus": 1}}, "gateway.timeouts: unknown key 'bogus'; allowed keys: connect, ttfb, idle, total"),
        ({"bogus": 1}, "gateway: unknown key 'bogus'"),
        ({"trace": {"sample": 0}}, "gateway.trace.sample (--trace-sample): expected a fraction in (0, 1]"),
        ({"max_body_bytes": "big"}, "gateway.max_body_bytes (--max-body-bytes): expected a positive integer (bytes)"),
        ({"inject_usage": "yes"}, "gateway.inject_usage"),
        ({"listen": "nope"}, 'gateway.listen (--listen): expected a "HOST:PORT" address'),
        ({"slos": {"x": "ttft=fast"}}, "gateway.slos.x (--slo)"),
    ],
)
def test_bad_values_name_the_key(data, needle):
    with pytest.raises(UsageError) as err:
        build_config(merge(UP, data))
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_no_upstream_and_bad_url():
    with pytest.raises(UsageError, match="give at least one upstream"):
        build_config({})
    with pytest.raises(UsageError, match="http:// or https://"):
        build_config({"upstreams": ["127.0.0.1:8000"]})
    for url in ("http://h:80x", "http://:8000"):  # a port that is not a number, no host: one line, not a traceback
        with pytest.raises(UsageError, match="HOST:PORT"):
            build_config({"upstreams": [url]})
    with pytest.raises(UsageError, match="HOST:PORT"):
        build_config({"upstream": [{"url": "http://h:99999999"}]})


def test_flag_errors_are_usage_errors():
    with pytest.raises(UsageError, match="--idle-timeout"):
        build_parser().parse_args(["--idle-timeout", "soon"])


def test_unreadable_toml(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[gateway\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        read_toml(bad)
    with pytest.raises(UsageError, match="cannot read"):
        read_toml(tmp_path / "missing.toml")


def test_file_without_gateway_table(tmp_path):
    plain = tmp_path / "plain.toml"
    plain.write_text('upstreams = ["http://127.0.0.1:8000"]\n')
    assert read_toml(plain) == {"upstreams": ["http://127.0.0.1:8000"]}
    other = tmp_path / "other.toml"
    other.write_text("[replay]\nrate = 3\n")
    with pytest.raises(UsageError, match=r"no \[gateway\] table"):
        read_toml(other)


def test_cli_exit_status_and_one_line(tmp_path, capsys):
    from slogate.gateway.cli import main

    assert main(["--upstream", "http://127.0.0.1:1", "--idle-timeout", "abc"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("slogate gateway: error:") and "--idle-timeout" in err and "\n" not in err
    assert main(["--upstream", "http://127.0.0.1:1", "--trace-sample", "1.5"]) == 2
    assert "gateway.trace.sample" in capsys.readouterr().err


GW = '[gateway]\nupstreams = ["http://127.0.0.1:8000"]\n'


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ('[gatway]\nlisten = "1.2.3.4:5"\n', "top-level [gatway] is unknown (did you mean [gateway]?)"),
        ("[timeouts]\nidle = 0.2\n", "top-level [timeouts] is outside [gateway] and would be ignored: write it [gateway.timeouts]"),
        ("[timeout]\nidle = 0.2\n", "(did you mean [gateway.timeouts]?)"),
        ("[sim]\ngpu = \"h100-sxm\"\n", "slogate sim --config"),
        ('[gateway.routing]\npolicy = "round-robin"\n[routing]\npolicy = "least-requests"\n',
         "both [routing] and [gateway.routing] are given"),
        ('[[gateway.upstream]]\nurl = "http://127.0.0.1:8001"\n[[upstream]]\nurl = "http://127.0.0.1:8002"\n',
         "both [[upstream]] and [[gateway.upstream]] are given"),
    ],
)
def test_stray_top_level_tables_are_errors(tmp_path, extra, needle):
    path = tmp_path / "slogate.toml"
    path.write_text(GW + extra)
    with pytest.raises(UsageError) as err:
        read_toml(path)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_top_level_key_before_gateway_and_replay_table(tmp_path):
    path = tmp_path / "slogate.toml"
    path.write_text('listen = "127.0.0.1:9000"\n' + GW)
    with pytest.raises(UsageError, match=r"top-level key 'listen' is outside \[gateway\]"):
        read_toml(path)
    path.write_text(GW + '[replay]\ntarget = "http://127.0.0.1:8000"\n[routing]\npolicy = "round-robin"\n')
    assert read_toml(path) == {"upstreams": ["http://127.0.0.1:8000"], "routing": {"policy": "round-robin"}}
    path.write_text('[gatway]\nupstreams = ["http://127.0.0.1:8000"]\n')
    with pytest.raises(UsageError, match=r"no \[gateway\] table \(found: gatway\); did you mean \[gateway\]"):
        read_toml(path)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"upstreams": ["http://user:secret@127.0.0.1:8000/pre"]}, "without user:password@"),
        ({"upstreams": ["http://127.0.0.1:8000/pre?x=1"]}, "without a ?query"),
        ({"upstream": [{"url": "http://127.0.0.1:8000#pool=long"}]}, "without a #fragment"),
        ({"upstreams": ["http://127.0.0.1:0"]}, "a port 1-65535"),
    ],
)
def test_upstream_url_parts_that_would_be_dropped(data, needle):
    with pytest.raises(UsageError) as err:
        build_config(data)
    assert needle in str(err.value) and "secret" not in str(err.value)
    assert build_config({"upstreams": ["http://127.0.0.1:8000/pre"]}).upstreams == ["http://127.0.0.1:8000/pre"]


def test_trace_dir_that_is_a_file(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for bad in (afile, afile / "traces"):
        with pytest.raises(UsageError, match=r"gateway\.trace\.dir \(--trace-dir\): expected a directory"):
            build_config(merge(UP, {"trace.dir": str(bad)}))
    later = tmp_path / "not" / "yet"
    assert build_config(merge(UP, {"trace.dir": str(later)})).trace.dir == str(later)
    assert not later.parent.exists()  # created by the writer with its first segment, not at config time


async def _no_serve(cfg: object) -> None:  # a config wrongly accepted must fail the test, never serve
    return None


def test_duration_flags_are_finite(capsys, monkeypatch):
    from slogate.gateway.cli import main

    monkeypatch.setattr("slogate.gateway.server.serve", _no_serve)
    for value in ("1e400", "1e400ms", "inf"):
        with pytest.raises(UsageError, match="--idle-timeout"):
            build_parser().parse_args(["--idle-timeout", value])
    assert main(["--upstream", "http://127.0.0.1:1", "--shutdown-grace", "1e999"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--shutdown-grace" in err and "finite" in err and "\n" not in err


@pytest.mark.parametrize("flag", ["--listen", "--admin-listen"])
def test_a_listen_host_that_does_not_resolve_is_a_one_line_error(flag: str) -> None:
    """With one process it was a socket.gaierror traceback and exit 1 (--workers already said it in one line)."""
    import subprocess
    import sys

    from tests.servers import free_port

    args = ["--listen", f"127.0.0.1:{free_port()}"] if flag == "--admin-listen" else []
    proc = subprocess.run([sys.executable, "-m", "slogate", "gateway", "--upstream", "http://127.0.0.1:9", *args,
                           flag, "host.invalid:19790"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "slogate gateway: error: cannot listen on " in proc.stderr and "host.invalid" in proc.stderr


@pytest.mark.parametrize(("args", "fragment"), [
    (["--slo", "a:ttft=1", "--slo", "a:e2e=2"], "--slo: two SLOs are named 'a'"),
    (["--slo", "ttft=1", "--slo", "e2e=2"], "--slo: two SLOs are named 'default'"),
    (["--trace-sample", "0.5"], "--trace-sample set without --trace-dir"),
    (["--trace-chunk-times", "--session-header", "X-S"], "--trace-chunk-times, --session-header set without --trace-dir"),
    (["--chat-template", "gemma"], "--chat-template gemma (gateway.tokens.template) set without --tokenizer"),
])
def test_options_that_would_be_ignored_are_errors(args: list[str], fragment: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A repeated SLO name kept the last one; capture options without a capture did nothing. Both silently."""
    from slogate.cli import main as slogate

    assert slogate(["gateway", "--upstream", "http://127.0.0.1:9", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1, err


def test_too_many_workers_names_the_limit(capsys):
    from slogate.cli import main as slogate

    assert slogate(["gateway", "--upstream", "http://127.0.0.1:9", "--workers", "100000",
                    "--admin-listen", "127.0.0.1:19999"]) == 2
    assert "an integer from 1 to 1024" in capsys.readouterr().err
