"""The console summary of a run: a rich table when rich is installed, plain aligned text otherwise.

Formatting only (milliseconds for latencies); rich is imported lazily, here.
"""

from __future__ import annotations

import sys
from typing import TextIO

from slogate.replay.results import Results
from slogate.traces.metrics import Summary
from slogate.traces.summary import RunSummary


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def rows(results: Results) -> list[tuple[str, str]]:
    s, env = results.summary, results.environment
    out = [("INTERRUPTED", _interrupted(results))] if s.interrupted else []
    out += [
        ("server / clock", f"{env.server_kind or '-'} {env.server_version or ''} / {env.clock}".strip()),
        ("prompts / output forcing", f"{env.tokenizer or '-'} / {env.output_forcing or '-'}"
         + ("  (output length NOT forced: see drift)" if env.output_forcing == "none" else "")),
        ("prompt length counts", _convention(env.prompt_tokens)
         + (f"; checked: {env.prompt_lengths_checked}" if env.prompt_lengths_checked else "")),
        ("sent before the run", ", ".join(f"{v} {k}" for k, v in env.warmup_traffic.items()) or "nothing"),
        ("requests (failed)", f"{s.requests} ({s.failed})"),
        ("duration", f"{s.duration_s:.2f} s"),
        ("offered / sent / completed rate", f"{_f(s.offered_rate_rps)} / {_f(s.send_rate_rps)} / {s.request_rate_rps:.2f} req/s"),
        ("output tokens/s", f"{s.output_tokens_per_s:.1f}"),
        ("total tokens/s", f"{s.total_tokens_per_s:.1f}"),
        (f"goodput ({s.slo or 'no SLO: successes'})", f"{s.goodput_rps:.2f} req/s, {s.goodput_tokens_per_s:.1f} tok/s"),
        ("SLO attainment", "-" if s.slo_attainment is None else f"{100 * s.slo_attainment:.1f} %"),
    ]
    for name, summ in (("TTFT", s.ttft_s), ("TPOT = ITL (per request)", s.tpot_s),
                       ("ITL (all gaps pooled)", s.itl_s), ("E2E", s.e2e_s),
                       ("effective E2E", s.effective_e2e_s), ("schedule lag", s.schedule_lag_s)):
        out.append((f"{name} p50/p90/p99/max ms", _pcts(summ)))
    out.append(("token drift in/out", f"{_pct(s.input_token_drift)} / {_pct(s.output_token_drift)}"))
    if s.cost_per_hour_usd is not None:
        out.append(("$/1M output tokens (goodput)", f"{_f(s.cost_per_million_output_tokens)} ({_f(s.goodput_cost_per_million_output_tokens)})"))
        out.append(("$/1k requests (goodput)", f"{_f(s.cost_per_1k_requests)} ({_f(s.goodput_cost_per_1k_requests)})"))
    out.append(("degraded", "no" if not s.degraded else "YES: " + "; ".join(s.degraded_reasons)))
    return out


def _convention(name: str | None) -> str:
    if name == "content":
        return "content (message tokens, as AIPerf/guidellm/vllm bench; the server adds its template)"
    return "server (the server's prompt_tokens, chat template included)" if name == "server" else "-"


def _interrupted(results: Results) -> str:
    return f"yes (Ctrl-C/SIGTERM): {interruption_counts(results.summary)}"


def interruption_counts(s: RunSummary) -> str:
    """`S of P planned requests sent, C cancelled in flight, N not sent` ("?" where unknown)."""
    planned = "?" if s.planned_requests is None else s.planned_requests
    not_sent = "?" if s.not_sent_requests is None else s.not_sent_requests
    return (f"{s.sent_requests} of {planned} planned requests sent, {s.cancelled_requests} cancelled in flight, "
            f"{not_sent} not sent")


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def _pcts(s: Summary) -> str:
    return "/".join(_ms(getattr(s, k)) for k in ("p50", "p90", "p99", "max"))


def render(results: Results, file: TextIO | None = None) -> None:
    file = file or sys.stdout
    env = results.environment
    title = f"slogate replay → {env.target}" + (f" [{', '.join(f'{k}={v}' for k, v in env.labels.items())}]" if env.labels else "")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title, file=file)
        for k, v in rows(results):
            print(f"  {k:<34} {v}", file=file)
        return
    table = Table(title=title, show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value")
    for k, v in rows(results):
        table.add_row(k, v)
    Console(file=file, width=140).print(table)
