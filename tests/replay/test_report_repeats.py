"""`slogate report` reads `slogate replay --repeat N` directories: each is one run whose values are its
repeats' means, with each metric's run-to-run spread, and each difference's interval is the one
`slogate compare --repeat N` computes (the same functions: equal numbers). Repeats on the sim in virtual
time (step-time jitter 5 %, each repeat its own seed): the same sim with other seeds is within the noise, a
sim with less HBM bandwidth (TPOT +41 %) is flagged significant, in the page and in conclusions.json.

Virtual time, so that the verdicts are the seeds' and not the machine's: on the real clock the three
"same" repeats ran after the three "base" ones, and a shared machine that got quieter in between made a
real −6 % TTFT p99 change (once in 18 runs), which the report rightly flagged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from tests.replay.test_compare_runs import make_trace, replay_args
from tests.replay.test_compare_significance import BASE, SLOW
from tests.replay.test_report import assert_four_sections, chromium, console_errors


@pytest.fixture(scope="module")
def repeats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("report-repeats")
    trace = make_trace(d / "t.jsonl.zst", rate=20, seconds=1.5)
    out = {}
    # each repeat of a sim: target runs seed + k - 1: seeds 1-3, 11-13 and 21-23 (no repeat shares a seed)
    for name, target in (("base", BASE.format(seed=1)), ("same", BASE.format(seed=11)), ("slow", SLOW.format(seed=21))):
        args = replay_args(trace, target=target, virtual=True)
        assert slogate(["replay", *args, "--out", str(d / name), "--quiet", "--repeat", "3"]) == 0
        out[name] = d / name
    return out


def report(dirs: list[Path], out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, list[dict]]:
    assert slogate(["report", *map(str, dirs), "-o", str(out), "--no-plots"]) == 0
    capsys.readouterr()
    return out.read_text(), json.loads((out.parent / "conclusions.json").read_text())["conclusions"]


def test_same_sim_other_seeds_is_within_the_noise(repeats: dict[str, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    page, conclusions = report([repeats["base"], repeats["same"]], tmp_path / "r.html", capsys)
    diff, = [c for c in conclusions if c["topic"] == "difference"]
    assert diff["run"] == "same" and "no difference beyond the noise" in diff["text"], diff["text"]
    assert "over 3 vs 3 repeats" in diff["text"]
    assert diff["values"]["tpot_s.p50.significant"] == "False" and diff["values"]["ttft_s.p99.significant"] == "False"
    assert '<div id="spread">' in page and '<div id="differences">' in page and "within the noise" in page
    assert 'href="#differences"' in page  # the conclusion links to the table it rests on


def test_slower_tpot_is_flagged_significant(repeats: dict[str, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    page, conclusions = report([repeats["base"], repeats["same"], repeats["slow"]], tmp_path / "r.html", capsys)
    diffs = {c["run"]: c for c in conclusions if c["topic"] == "difference"}
    assert set(diffs) == {"same", "slow"}
    slow = diffs["slow"]
    assert slow["values"]["tpot_s.p50.significant"] == "True", slow["text"]
    assert 0.25 < slow["values"]["tpot_s.p50.relative"] < 0.5  # 1.3× in virtual time; the real clock adds a little
    assert "real differences: " in slow["text"] and "tpot_s.p50 +" in slow["text"]
    assert diffs["same"]["values"]["tpot_s.p50.significant"] == "False"
    assert "<b>significant</b>" in page
    # the spread table: every value is a mean ± sd over the 3 repeats
    spread = page.split('<div id="spread">')[1].split("</table>")[0]
    assert spread.count("<tr>") == 4 and " ± " in spread  # header + three runs
    dom = chromium("--dump-dom", (tmp_path / "r.html").as_uri(), tmp=tmp_path)
    assert dom.returncode == 0 and not console_errors(dom.stderr), dom.stderr[-2000:]
    assert_four_sections(dom.stdout)  # every conclusion's figure link (#differences) resolves


def test_the_report_and_compare_give_the_same_interval(repeats: dict[str, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """One significance implementation: the report's interval of the TPOT change is compare --repeat's."""
    from slogate.replay import report as report_mod

    data = report_mod.collect([repeats["base"], repeats["slow"]])
    runs = [str(repeats[s] / f"run-{k}") for s in ("base", "slow") for k in (1, 2, 3)]
    assert slogate(["compare", "--repeat", "3", *runs, "--json", "--seed", "0",
                    "--resamples", str(report_mod.CI_RESAMPLES)]) == 0
    row = json.loads(capsys.readouterr().out)["metrics"]["tpot_s.p50"]
    assert data.cis[0] is not None
    assert list(data.cis[0]["tpot_s.p50"]) == pytest.approx(row["ci"][0], rel=1e-12)
    assert data.runs[1].results.summary.tpot_s.p50 == pytest.approx(row["values"][1])
    assert data.runs[1].spread["tpot_s.p50"].n == 3 and data.runs[1].repeats == ["run-1", "run-2", "run-3"]


def test_a_broken_repeats_directory_is_one_line_exit_2(repeats: dict[str, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "repeats.json").write_text(json.dumps({"n": 2, "runs": ["run-1", "run-2"]}))
    assert slogate(["report", str(repeats["base"]), str(broken), "-o", str(tmp_path / "x.html"), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run-1/results.json is missing" in err[0] and "--repeat N" in err[0], err
