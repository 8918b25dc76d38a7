"""`slogate trace`: statistics, validation, conversion and a peek at trace files.

The imperative shell over `traces.formats`, `traces.reader` and `traces.stats`: parses arguments,
prints plain aligned text or JSON. User mistakes become `UsageError` (one line, exit 2); never
prints a traceback for a bad file.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence

import msgspec

from slogate.traces import formats
from slogate.traces.reader import SegmentReader, read_trace, segment_paths
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.segments import TraceError, encode_header, segment_prefix
from slogate.traces.slo import Slo, SloError, parse_slo
from slogate.traces.stats import (
    MAX_SPAN_S,
    TokenStats,
    TraceStats,
    block_tokens,
    span_text,
    trace_stats,
)
from slogate.traces.usage import UsageError
from slogate.traces.validate import problems as record_problems

EPILOG = """\
formats: slogate (*.jsonl.zst segments or a directory of them), mooncake (JSONL),
         azure (CSV, 2023 and 2024 layouts), burstgpt (CSV, import only),
         agentic (a directory of JSON session files, one session each; import only).
         Guessed from the file's content (input) or name (output) unless --from/--to is given.

examples:
  slogate trace stats traces/samples/azure_conv_10min.csv
  slogate trace stats capture/ --json                 # all segments of a capture, merged
  slogate trace convert conversation_trace.jsonl conv.jsonl.zst
  slogate trace convert capture/ replay.jsonl --to mooncake   # for AIPerf / vllm bench serve
  slogate trace convert in.jsonl.zst out.csv --to azure --azure-layout 2023
  slogate trace validate capture/slogate-20260101T000000Z-000000.jsonl.zst
  slogate trace head trace.jsonl.zst -n 5
  slogate trace merge gw-a/ gw-b/ -o merged.jsonl.zst    # two gateways' captures, sessions made whole
"""


MERGE_EPILOG = """\
Each CAPTURE is one gateway's capture. Records go on one timeline (by each header's start time);
keyed sessions (--session-header, user) already share their hash; a prefix-continuation session
whose first turn extends a request of another capture is joined to that session. Turns are
renumbered in arrival order and think times recomputed. All captures must share one salt.

example:
  slogate trace merge gw-a/ gw-b/ -o merged.jsonl.zst && slogate trace stats merged.jsonl.zst
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slogate trace",
        description="Inspect, validate and convert LLM request traces (slogate, Mooncake, Azure, BurstGPT).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    fmt_help = f"input format ({', '.join(formats.INPUT_FORMATS)}); guessed when omitted"

    p = sub.add_parser("stats", help="requests, span, rate, burstiness, token lengths, prefix reuse",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE", help="trace file(s); slogate segments are merged into one trace")
    p.add_argument("--json", action="store_true", help="print JSON (one object, or one per file keyed by path)")
    p.add_argument("--from", dest="fmt", metavar="FMT", help=fmt_help)
    p.add_argument("--slo", action="append", default=[], metavar="[NAME:]SPEC",
                   help="SLO for goodput and attainment, e.g. ttft=0.5,tpot=50ms (repeatable; default: the SLOs "
                        "in the trace header)")

    p = sub.add_parser("convert", help="convert a trace between formats",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.add_argument("--from", dest="fmt", metavar="FMT", help=fmt_help)
    p.add_argument("--to", dest="to", metavar="FMT", help="output format (slogate, mooncake, azure, csv, parquet); guessed from OUT's name (.csv means azure)")
    p.add_argument("--azure-layout", choices=("2023", "2024"), help="Azure CSV timestamp layout (default: as imported, else 2024)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")

    p = sub.add_parser("merge", help="merge gateway captures into one trace, sessions recomputed",
                       epilog=MERGE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("captures", nargs="+", metavar="CAPTURE", help="capture directories or segment files, one per gateway")
    p.add_argument("-o", "--out", required=True, metavar="OUT", help="the merged trace (one .jsonl.zst segment)")
    p.add_argument("--session-window", type=float, default=600.0, metavar="S",
                   help="longest pause between an answer and the next turn that continues it (default 600)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")

    p = sub.add_parser("validate", help="check that trace files read cleanly and hold sane values",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--from", dest="fmt", metavar="FMT", help=fmt_help)

    p = sub.add_parser("head", help="print the header and the first records as JSON lines",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE")
    p.add_argument("-n", type=int, default=10, metavar="N", help="number of records (default 10)")
    p.add_argument("--from", dest="fmt", metavar="FMT", help=fmt_help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(_COMMANDS[args.command](args))
    except (formats.FormatError, TraceError) as exc:
        raise UsageError(str(exc)) from None
    except BrokenPipeError:  # `slogate trace head … | head -1`
        sys.stderr.close()
        return 0


# -- loading ----------------------------------------------------------------------------------------


def _check_exists(paths: Sequence[str]) -> None:
    for p in paths:
        if not os.path.exists(p):
            raise UsageError(f"no such trace file: {p}")


def _traces(files: Sequence[str], fmt: str | None) -> list[tuple[str, str, TraceHeader, list[RequestRecord]]]:
    """(label, format, header, records) per trace: slogate (or agentic) files together, other formats one by one."""
    _check_exists(files)
    fmts = [fmt or formats.guess_format(f) for f in files]
    for multi in ("slogate", "agentic"):  # segments of one capture; concurrent sessions of one run
        if all(f == multi for f in fmts):
            header, records = formats.load(list(files), multi)
            return [(" ".join(files), multi, header, records)]
    return [(f, g, *formats.load(f, g)) for f, g in zip(files, fmts, strict=True)]


# -- stats -------------------------------------------------------------------------------------------


def _slos(specs: Sequence[str], header: TraceHeader) -> list[Slo]:
    """--slo values, else the SLOs the trace header recorded."""
    try:
        if specs:
            return [parse_slo(spec, default_name=f"slo{i}" if i else "default") for i, spec in enumerate(specs)]
        return [parse_slo(spec, default_name=name) for name, spec in header.slos.items()]
    except SloError as exc:
        raise UsageError(f"--slo: {exc}") from None


def _stats(args: argparse.Namespace) -> int:
    results = [(label, fmt, trace_stats(records, _slos(args.slo, header), block_tokens=block_tokens(header)))
               for label, fmt, header, records in _traces(args.files, args.fmt)]
    if args.json:
        payload = results[0][2] if len(results) == 1 else {label: s for label, _, s in results}
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(payload)).decode() + "\n")
        return 0
    for i, (label, fmt, s) in enumerate(results):
        if i:
            print()
        print(_stats_text(label, fmt, s))
    return 0


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if abs(value) >= 1e15:  # an absurd value (a wrong timestamp unit): not 300 digits
        return f"{value:.3e}"
    return f"{value:,.{digits}f}"


def _tokens_text(t: TokenStats) -> str:
    return f"mean {_num(t.mean, 1)}   p50 {_num(t.p50)}   p99 {_num(t.p99)}"


def _stats_text(label: str, fmt: str, s: TraceStats) -> str:
    reuse = "n/a (no hash ids)" if s.prefix_reuse is None else f"{s.prefix_reuse:.3f}"
    rows = [
        ("trace", f"{label} ({fmt})"),
        ("requests", f"{s.requests:,}"),
        ("duration_s", _num(s.duration_s, 1) + (f"   ({span_text(s.duration_s)}: timestamps in the wrong unit? "
                                                 "see slogate trace validate)" if s.duration_s > MAX_SPAN_S else "")),
        ("mean_rps", _num(s.mean_rps, 3)),
        ("interarrival_cv", _num(s.interarrival_cv, 3)),
        ("input_tokens", _tokens_text(s.input_tokens)),
        ("output_tokens", _tokens_text(s.output_tokens)),
        ("prefix_reuse", reuse),
        ("errors", f"{s.errors:,}"),
    ]
    if s.input_estimated:
        rows[5] = ("input_tokens", _tokens_text(s.input_tokens)
                   + f"   (estimated for {s.input_estimated:,} of {s.requests:,} requests)")
    if s.ideal_prefix_reuse is not None:
        rows.append(("ideal_prefix_reuse", f"{s.ideal_prefix_reuse:.3f}"))
    if s.sessions is not None:
        x = s.sessions
        rows.append(("sessions", f"{x.sessions:,}   subagents {x.subagents:,}   turns/session "
                                 + _tokens_text(x.turns_per_session)))
        rows.append(("think_s", f"mean {_num(x.think_s.mean, 3)}   p50 {_num(x.think_s.p50, 3)}   "
                                f"p99 {_num(x.think_s.p99, 3)}"))
        rows.append(("context_growth", _tokens_text(x.context_growth_tokens) + "   tokens per turn"))
    m = s.summary
    if m is not None and m.e2e_s.count:  # measured timings (a capture or a run), not an imported public trace
        if m.failed_by_class:
            rows.append(("failed_by_class", ", ".join(f"{k} {v:,}" for k, v in m.failed_by_class.items())))
        for key in ("ttft_s", "tpot_s", "e2e_s"):
            d = getattr(m, key)
            rows.append((key, f"p50 {_num(d.p50, 4)}   p90 {_num(d.p90, 4)}   p99 {_num(d.p99, 4)}   "
                              f"(n={d.count:,}, successful requests)"))
        rows.append(("output_tokens_per_s", _num(m.output_tokens_per_s, 1)))
        for name, g in m.goodput_by_slo.items():
            rows.append((f"slo {name}", f"attainment {g['slo_attainment']:.4f}   good {int(g['good_requests']):,}   "
                                        f"goodput {g['goodput_rps']:.3f} req/s"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


# -- convert -----------------------------------------------------------------------------------------


def _convert(args: argparse.Namespace) -> int:
    _check_exists([args.input])
    to = args.to or formats.guess_format(args.output, for_output=True)
    formats.module(to)  # unknown --to fails before reading
    if os.path.exists(args.output) and not args.force:
        raise UsageError(f"{args.output} exists: choose another OUT or pass --force to overwrite it")
    header, records = formats.load(args.input, args.fmt)
    options = {"layout": args.azure_layout} if to == "azure" and args.azure_layout else {}
    try:
        n = formats.save(records, args.output, to, header=header, **options)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror}") from None
    print(f"wrote {n:,} records to {args.output} ({to})")
    if to == "mooncake" and records:  # (an empty trace has no lengths or rate to give a peer)
        from slogate.traces.formats.peers import mooncake_commands

        print(mooncake_commands(args.output, records))
    return 0


# -- validate ----------------------------------------------------------------------------------------

def _validate(args: argparse.Namespace) -> int:
    _check_exists(args.files)
    failed = 0
    for path in args.files:
        try:
            fmt = args.fmt or formats.guess_format(path)
            if fmt == "slogate":
                trace = read_trace(path)
                records, note = trace.records, f"schema v{trace.header.schema_version}, source {trace.header.source}"
                if trace.truncated:  # a crash: read up to the cut, as the reader does for every command
                    note += (f"; cut short: {trace.recovered:,} records recovered from a cut last frame, "
                             f"{trace.skipped_bytes:,} bytes skipped")
            else:
                _, records = formats.load(path, fmt)
                note = ""
        except (TraceError, formats.FormatError) as exc:
            print(f"{path}: invalid: {exc}")
            failed += 1
            continue
        problems = record_problems(records)
        status = "invalid" if problems else "ok"
        print(f"{path}: {status} ({fmt}, {len(records):,} records{', ' + note if note else ''})")
        for problem in problems:
            print(f"  {problem}")
        failed += bool(problems)
    return 1 if failed else 0


# -- head --------------------------------------------------------------------------------------------


def _head(args: argparse.Namespace) -> int:
    if args.n < 0:
        raise UsageError(f"-n must be 0 or more, got {args.n}")
    _check_exists([args.file])
    fmt = args.fmt or formats.guess_format(args.file)
    enc = msgspec.json.Encoder()
    out = sys.stdout.buffer
    if fmt == "slogate":  # stream: no need to read the whole capture
        header, records = _first_records(segment_paths(args.file), args.n)
    else:
        header, all_records = formats.load(args.file, fmt)
        records = all_records[: args.n]
    out.write(encode_header(header))
    for record in records:
        out.write(enc.encode(record) + b"\n")
    out.flush()
    return 0


def _first_records(paths: Sequence[os.PathLike[str]], n: int) -> tuple[TraceHeader, list[RequestRecord]]:
    """The first `n` records of the segments in order (a capture directory: on from one segment to the
    next), read no further than needed; `t` on the first header's clock (a restart's segments start later)."""
    header: TraceHeader | None = None
    records: list[RequestRecord] = []
    for path in paths:
        reader = SegmentReader(path)
        shift: float | None = None
        for record in reader:
            if len(records) >= n:
                break
            if shift is None:
                start = reader.header.start_unix if reader.header else 0.0
                shift = start - header.start_unix if header and header.start_unix > 0 and start > 0 else 0.0
            record.t += shift
            records.append(record)
        header = header or reader.header
        if len(records) >= n and header is not None:
            break
    return header or TraceHeader(), records


def _merge(args: argparse.Namespace) -> int:
    from slogate.traces.session_merge import MergeError, merge_captures

    _check_exists(args.captures)
    if os.path.exists(args.out) and not args.force:
        raise UsageError(f"{args.out} exists: choose another --out or pass --force to overwrite it")
    if not args.session_window > 0:
        raise UsageError(f"bad --session-window {args.session_window}: a positive number of seconds, e.g. 600")
    captures = []
    seen: dict[str, str] = {}
    for path in args.captures:
        key = os.path.realpath(path)
        if key in seen:
            raise UsageError(f"{path} is given twice (as {seen[key]} and {path}): its requests would count twice; "
                             "give each capture once")
        seen[key] = path
        fmt = formats.guess_format(path)
        if fmt != "slogate":
            raise UsageError(f"{path} is a {fmt} trace: trace merge takes slogate captures (convert it first)")
        captures += _writer_captures(path)
    try:
        merged = merge_captures(captures, window_s=args.session_window)
    except MergeError as exc:
        raise UsageError(str(exc)) from None
    try:
        n = formats.save(merged.records, args.out, "slogate", header=merged.header)
    except OSError as exc:
        raise UsageError(f"cannot write {args.out}: {exc.strerror}") from None
    print(f"wrote {n:,} records from {len(args.captures)} captures ({len(captures)} gateway processes) to "
          f"{args.out}: {merged.sessions:,} sessions, {merged.joined:,} joined across processes")
    return 0


def _writer_captures(path: str) -> list[tuple[str, TraceHeader, list[RequestRecord]]]:
    """A capture split by the gateway process that wrote it (segment name prefix and start_unix): each
    worker of a --workers run, each restarted worker and each gateway restarted into the directory
    derived its prefix sessions on its own, so a conversation whose turns went to several of them is
    joined only when they are merged as captures of their own."""
    groups: dict[tuple[str, float], list[os.PathLike[str]]] = {}
    for segment in segment_paths(path):
        reader = SegmentReader(segment)
        next(iter(reader), None)  # the header frame (and at most the first frame of records)
        start = reader.header.start_unix if reader.header else 0.0
        groups.setdefault((segment_prefix(segment.name), start), []).append(segment)
    if len(groups) == 1:
        return [(path, *formats.load(path, "slogate"))]
    return [(f"{path} ({prefix}, start {start:.3f})", *formats.load(segments, "slogate"))
            for (prefix, start), segments in groups.items()]


_COMMANDS = {"stats": _stats, "convert": _convert, "merge": _merge, "validate": _validate, "head": _head}
