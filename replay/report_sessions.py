"""The report's sessions part: per-run session table, session timelines and TTFT vs context length.

Shown only for runs whose records carry sessions (session-timed replays, gateway captures with
sessions). `sessions_html` is plain HTML from `results.json` and the records; `draw` makes the two
figures with replay.report_plots' matplotlib setup. Never reads files and never changes a run.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from slogate.traces.record import RequestRecord, is_error

if TYPE_CHECKING:
    from slogate.replay.report_model import ReportData, RunData

MAX_SESSIONS_DRAWN = 40  # timeline rows per run (the longest sessions first)
HOW = ("one row per session, time left to right: a bar is a turn from its send to its last token (red: failed), "
       "a gap is think time (the user or tool), a subagent's row is indented under its parent. The scatter is "
       "each turn's TTFT against its prompt length: with prefix caching TTFT grows slowly with context, "
       "without it about linearly.")


class SessionTimeline(msgspec.Struct):
    """One session of a run, for the timeline."""

    session: str
    parent: str | None
    turns: list[tuple[float, float, bool]]  # (send, end, failed) per turn, in order

    @property
    def start(self) -> float:
        return self.turns[0][0]

    @property
    def end(self) -> float:
        return max(e for _, e, _ in self.turns)


def timelines(records: Sequence[RequestRecord]) -> list[SessionTimeline]:
    """Sessions of the records, children right after their parent, roots by start time."""
    by: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.session is not None:
            by[r.session].append(r)
    out: dict[str, SessionTimeline] = {}
    for name, turns in by.items():
        turns.sort(key=lambda r: (r.turn if r.turn is not None else 0, r.t))
        # a session-timed replay's `t` is the actual send (a gateway's: the arrival); e2e counts from it
        out[name] = SessionTimeline(session=name, parent=turns[0].parent_session,
                                    turns=[(r.t, r.t + (r.e2e or 0.0), is_error(r)) for r in turns])
    children: dict[str, list[SessionTimeline]] = defaultdict(list)
    for s in out.values():
        if s.parent in out:
            children[s.parent].append(s)  # type: ignore[index]
    ordered: list[SessionTimeline] = []

    def visit(s: SessionTimeline) -> None:
        ordered.append(s)
        for c in sorted(children.get(s.session, ()), key=lambda c: c.start):
            visit(c)

    for s in sorted((s for s in out.values() if s.parent not in out), key=lambda s: s.start):
        visit(s)
    return ordered


def context_points(records: Sequence[RequestRecord]) -> list[tuple[int, float, int]]:
    """(prompt tokens, TTFT, turn) of every successful session turn with both."""
    return [(r.input_tokens, r.ttft, r.turn or 0) for r in records
            if r.session is not None and r.input_tokens and r.ttft is not None and not is_error(r)]


def _has_sessions(run: RunData) -> bool:
    return run.results.sessions is not None or any(r.session is not None for r in run.records)


def draw(data: ReportData, *, max_runs: int) -> dict[str, str | None]:
    """`sessions:RUN` images (timeline + TTFT vs context) for the first `max_runs` runs with sessions."""
    runs = [r for r in data.runs if _has_sessions(r) and r.records][:max_runs]
    return {f"sessions:{r.name}": figure(r) for r in runs}


def figure(run: RunData) -> str | None:
    from slogate.replay.report_plots import _plt, _png

    lines = timelines(run.records)
    if not lines:
        return None
    shown = lines if len(lines) <= MAX_SESSIONS_DRAWN else sorted(
        lines, key=lambda s: s.end - s.start, reverse=True)[:MAX_SESSIONS_DRAWN]
    keep = {id(s) for s in shown}
    shown = [s for s in lines if id(s) in keep]
    plt = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, max(2.6, 0.28 * len(shown) + 1.2)),
                                 gridspec_kw={"width_ratios": [2, 1]})
    t0 = min(s.start for s in shown)
    for y, s in enumerate(shown):
        indent = 0.25 if s.parent else 0.0
        ax.broken_barh([(a - t0, max(e - a, 1e-4)) for a, e, _ in s.turns], (y - 0.35 + indent / 2, 0.7 - indent),
                       facecolors=["tab:red" if f else ("tab:green" if s.parent else "tab:blue") for _, _, f in s.turns])
        ax.plot([s.start - t0, s.end - t0], [y, y], color="0.7", linewidth=0.6, zorder=0)
    ax.set_yticks(range(len(shown)), [("  ↳ " if s.parent else "") + s.session[:14] for s in shown], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first session started")
    ax.set_title(f"{run.name}: sessions ({len(shown)} of {len(lines)} drawn; bars are turns, gaps think time)")
    pts = context_points(run.records)
    if pts:
        sc = bx.scatter([p[0] for p in pts], [p[1] * 1000 for p in pts], c=[min(p[2], 8) for p in pts], cmap="viridis",
                        s=14, alpha=0.8)
        fig.colorbar(sc, ax=bx, label="turn (8 = 8+)", ticks=sorted({min(p[2], 8) for p in pts}))
    bx.set_xlabel("prompt tokens (context length)")
    bx.set_ylabel("TTFT (ms)")
    bx.set_title("TTFT vs context length")
    fig.tight_layout()
    return _png(fig)


def _esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def _s(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


def sessions_html(data: ReportData, images: dict[str, str | None], note: str | None) -> str:
    """The "Sessions" block of the metrics section; empty when no run has sessions."""
    runs = [r for r in data.runs if _has_sessions(r)]
    if not runs:
        return ""
    head = ["run", "sessions", "subagents", "turns", "failed / unsent turns", "duration p50 / p90 (s)",
            "time to finish p99 (s)", "model time", "think time", "TTFT p50 by turn (ms)"]
    rows = []
    for r in runs:
        s = r.results.sessions
        if s is None:
            from slogate.replay.sessions import summarize

            s = summarize(r.records)
        if s is None:
            continue
        total = s.model_time_s + s.think_time_s
        share = f" ({s.model_time_s / total:.0%})" if total > 0 else ""
        by_turn = ", ".join(f"{k}: {d.p50 * 1000:.0f}" for k, d in list(s.ttft_by_turn.items())[:5] if d.p50 is not None)
        rows.append([_esc(r.name), str(s.sessions), str(s.subagents), str(s.turns),
                     f"{s.failed_turns} / {s.unsent_turns}",
                     f"{_s(s.duration_s.p50)} / {_s(s.duration_s.p90)}", _s(s.time_to_finish_s.p99),
                     f"{s.model_time_s:.3g} s{share}", f"{s.think_time_s:.3g} s", _esc(by_turn or "–")])
    table = ('<div class="wrap"><table><thead><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
             + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows) + "</tbody></table></div>")
    parts = [f'<div id="sessions"><h3>Sessions</h3><p class="meta">{_esc(HOW)}</p>', table]
    for r in runs:
        key = f"sessions:{r.name}"
        src = images.get(key)
        if src:
            parts.append(f'<img src="{src}" alt="{_esc("sessions of " + r.name)}">')
        elif key in images or note:
            parts.append(f'<p class="note">{_esc(note or "no per-request records to draw the sessions of " + r.name)}</p>')
    parts.append("</div>")
    return "".join(parts)
