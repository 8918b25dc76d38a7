"""`slogate sim calibrate`: fit the linear step model to any OpenAI-compatible server, write a TOML.

Sends a small designed workload (prompt sizes one at a time, decode batches via concurrency, a long
context), turns each request's TTFT or TPOT into a step sample and fits the median line (least
absolute deviations) for step ms = A + B·new_tokens + C·seqs + D·kv_tokens + E·attn_work (+ the client's TTFT overhead). Prompts are
synthetic filler words; it never sends, logs or stores real prompt text.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import msgspec

from slogate.replay.client import ClientConfig, complete, new_pool, start
from slogate.replay.forcing import Forcing, choose
from slogate.replay.sim.steptime import LinearCoefficients, solve
from slogate.replay.tokenizers import ServerTokenizer, probe_server_tokenizer
from slogate.traces.metrics import percentile
from slogate.traces.record import RequestRecord
from slogate.traces.usage import UsageError

# The prefill design: five sizes, so B rests on more than two medians (a noisy size moves it less).
DESIGN_PROMPTS = (16, 128, 256, 512, 1024)
FILLER = "the of and to in is it you that he was for on are with as his they at be"


class Sample(msgspec.Struct, frozen=True):
    """One design point: the step shape it exercises and what was measured (ms)."""

    kind: str  # "prefill" (TTFT of one prompt) or "decode" (TPOT at a concurrency)
    new_tokens: int
    seqs: int
    kv_tokens: int
    step_ms: float


class Calibration(msgspec.Struct):
    linear: LinearCoefficients
    ttft_overhead_ms: float
    max_num_seqs: int | None  # 1 when the server runs one request at a time
    samples: list[Sample]


def prompt(i: int, words: int) -> str:
    """A unique first word (no prefix-cache hits across requests), then filler words."""
    fill = FILLER.split()
    return " ".join([f"q{i}x"] + [fill[k % len(fill)] for k in range(words - 1)])


async def server_forcing(url: str, spec: str = "auto") -> Forcing:
    """How to force exact output lengths on `url`: the replay's own choice by probed server kind
    (llama.cpp ignores ignore_eos, so its end tokens are banned by logit_bias; DESIGN §7)."""
    from slogate.replay.target import probe

    async with aiohttp.ClientSession() as session:
        info = await probe(session, url.rstrip("/"), {}, wait_s=5.0)
    return choose(spec, info.kind)


class Prober:
    def __init__(self, url: str, model: str | None, timeout_s: float, forcing: Forcing | None = None) -> None:
        self.cfg = ClientConfig(base_url=url.rstrip("/"), model=model, endpoint="/v1/completions",
                                timeout_s=timeout_s)
        self.pool = new_pool(self.cfg)
        self.forcing = forcing or Forcing("ignore_eos")
        self.n = 0
        # Prompt tokens when a response carries no usage (llama-cpp-python's streams): the server's own
        # tokenize endpoint counts the prompt, so B is per token and not per word. None: not probed yet.
        self._session: aiohttp.ClientSession | None = None  # created when the endpoint is probed
        self._counter: ServerTokenizer | None = None

    async def one(self, words: int, max_tokens: int) -> RequestRecord:
        self.n += 1
        text = prompt(self.n, words)
        body: dict[str, object] = {"prompt": text, "stream": True, "temperature": 0.0,
                                   "stream_options": {"include_usage": True}}
        body.update(self.forcing.fields(max_tokens))
        if self.cfg.model:
            body["model"] = self.cfg.model
        rec = await complete(self.pool, self.cfg, start(self.pool, self.cfg, msgspec.json.encode(body),
                                                       intended_ns=time.perf_counter_ns()))
        if rec.error or rec.status != 200 or rec.ttft is None:
            raise UsageError(f"calibrate: {self.cfg.base_url} answered status {rec.status} ({rec.error}); "
                             "check --target and --model")
        if rec.input_tokens is None and (counter := await self._token_counter()) is not None:
            rec = msgspec.structs.replace(rec, input_tokens=await counter.count(text))
        return rec

    async def _token_counter(self) -> ServerTokenizer | None:
        """The server's tokenize endpoint (`/tokenize`, or `/extras/tokenize` on llama-cpp-python), probed
        once; None when it has none (the prompt's words then stand for its tokens)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s))
            self._counter = await probe_server_tokenizer(self._session, self.cfg.base_url, self.cfg.model, {})
        return self._counter

    async def close(self) -> None:
        self.pool.close()
        if self._session is not None:
            await self._session.close()

    async def batch(self, n: int, words: int, max_tokens: int) -> list[RequestRecord]:
        return list(await asyncio.gather(*(self.one(words, max_tokens) for _ in range(n))))


def _tokens(rec: RequestRecord, words: int) -> int:
    return rec.input_tokens or words


async def measure(url: str, *, model: str | None = None, prompt_words: tuple[int, ...] = DESIGN_PROMPTS,
                  batches: tuple[int, ...] = (1, 4, 8), long_words: int = 2048, decode_tokens: int = 48,
                  repeats: int = 3, timeout_s: float = 120.0, forcing: Forcing | None = None,
                  between: Callable[[], Awaitable[object]] | None = None) -> tuple[list[Sample], bool]:
    """Run the design; returns the samples (one per request and kind) and whether the server batches
    concurrent requests.

    Every prompt size is sent as the workload would send it (`decode_tokens` forced outputs), so each
    request yields a prefill sample (its TTFT) and a decode sample (its TPOT at context n + out/2);
    the sizes are sent round-robin, `repeats` rounds, so a burst of load on a shared machine hits one
    round of every size, not every repeat of one size.
    `between` runs after each design request: a workload interleaved with the design request by
    request sees the same machine load as the design.
    """
    p = Prober(url, model, timeout_s, forcing or await server_forcing(url))
    try:
        await p.one(8, 4)  # warm-up: connection, first-request costs
        sizes = (*prompt_words, long_words) if long_words else tuple(prompt_words)  # 0: no long-context point
        rounds: dict[int, list[RequestRecord]] = {w: [] for w in sizes}
        for _ in range(repeats):
            for words in sizes:
                rounds[words].append(await p.one(words, decode_tokens))
                if between is not None:
                    await between()
        samples: list[Sample] = []  # one per request: the fit takes the median line through them all
        for words, recs in rounds.items():
            for r in recs:
                n = _tokens(r, words)
                if words != long_words and r.ttft is not None:  # the long context is a decode point only:
                    samples.append(Sample("prefill", n, 1, n, 1e3 * r.ttft))  # its prefill would weigh on B alone
                if r.tpot is not None:
                    samples.append(Sample("decode", 1, 1, n + decode_tokens // 2, 1e3 * r.tpot))
        pair = await p.batch(2, 16, decode_tokens)
        first, second = sorted(pair, key=lambda r: r.ttft or 0.0)
        serial = (second.ttft or 0.0) > 0.8 * (first.e2e or 0.0)
        for b in () if serial else batches:
            for _ in range(repeats):
                recs = await p.batch(b, 16, decode_tokens)
                ctx = _tokens(recs[0], 16) + decode_tokens // 2
                samples += [Sample("decode", b, b, b * ctx, 1e3 * r.tpot) for r in recs if r.tpot is not None]
        return samples, not serial
    finally:
        await p.close()


NOISY = 0.10  # a median design request this far off the fitted model: the CLI warns that the server's speed moved
CURVED = 0.05  # a linear prefill fit missing a design size's median by more than this: fit E (attention) too
LAD_ROUNDS = 50  # iterations of the median (least absolute deviations) fit
LAD_FLOOR = 1e-3  # smallest residual weighed (rows are scaled to mean 1: 0.1 % of a kind's mean)


def fit(samples: list[Sample], *, batches: bool = True) -> tuple[LinearCoefficients, float]:
    """The median line through every request's sample (least absolute deviations) for A, B, C, D and
    the TTFT overhead (prefill rows carry it, decode rows do not).

    Median, not mean, and through all requests, not through each size's median: on a shared machine
    a third of the requests may run 30 % slow; a mean follows them, and the median of one size's five
    requests is one of them whenever three of the five were slow (llama.cpp's 256-word point once: it
    bent the curve downward, the straight line was kept with B 30 % high). The median line follows the
    typical request of every size at once.

    Each kind of row is divided by its mean: prefill TTFTs and decode TPOTs are measured on scales
    apart (10 s against 30 ms on a slow CPU), and unscaled the prefill rows swamp the decode ones
    (llama.cpp's TPOT came out 14 % low). E (quadratic attention) only when the prompts' TTFT is
    visibly curved upward, since fitting it to a straight line only adds noise to B (a negative E,
    TTFT curved downward, is load noise on a shared machine: the straight line is kept).

    A prefill row's attention work is n²/2 (one chunk from an empty context), a decode row's its
    context. A server that runs one request at a time never shows seqs apart from new tokens, so C
    is held at 0. In the straight line a negative D (a longer context making a decode step cheaper) is
    noise too, and D is then held at 0 (llama.cpp's decode is flat over 16-1036 tokens of context); with
    E, D and E share the decode rows and only their sum is the decode's cost per context token.
    """
    coef, overhead = _fit(samples, batches=batches, attention=False)
    if coef.d_ms < 0:
        coef, overhead = _fit(samples, batches=batches, attention=False, context=False)
    sizes = _design_sizes([s for s in samples if s.kind == "prefill"])
    # each size's median TTFT against the line's there (on a straight line, the median of its values at the size's prompts)
    miss = max((abs(statistics.median(model_ms(coef, overhead, s) for s in g)
                    / statistics.median(s.step_ms for s in g) - 1) for g in sizes), default=0.0)
    if miss > CURVED and len(sizes) >= 3:
        curved, curved_overhead = _fit(samples, batches=batches, attention=True)  # D and E share the decode rows
        if curved.e_ms >= 0:  # attention never makes a longer prompt cheaper per token: negative E is noise
            return curved, curved_overhead
    return coef, overhead


def _design_sizes(prefills: list[Sample]) -> list[list[Sample]]:
    """The prefill samples grouped by design size: counted prompts of one size differ by a token or two
    (the numbered first word), sizes by 2x or so; a gap of more than 10 % starts a new size."""
    groups: list[list[Sample]] = []
    for s in sorted(prefills, key=lambda s: s.new_tokens):
        if groups and s.new_tokens <= 1.1 * groups[-1][-1].new_tokens:
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


def _features(s: Sample) -> dict[str, float]:
    """A sample's row of the step model: the value each constant multiplies (`overhead` is the client's
    TTFT overhead, on prefill rows only). A prefill's attention work is n²/2, a decode's its context."""
    attn = s.new_tokens * s.new_tokens / 2 if s.kind == "prefill" else float(s.kv_tokens)
    return {"a": 1.0, "b": float(s.new_tokens), "c": float(s.seqs), "d": float(s.kv_tokens), "e": attn,
            "overhead": 1.0 if s.kind == "prefill" else 0.0}


def model_ms(c: LinearCoefficients, overhead_ms: float, s: Sample) -> float:
    """What the fitted model gives for a sample's shape (a prefill's TTFT includes the client overhead)."""
    f = _features(s)
    return (c.a_ms + c.b_ms * f["b"] + c.c_ms * f["c"] + c.d_ms * f["d"] + c.e_ms * f["e"]
            + overhead_ms * f["overhead"])


def _fit(samples: list[Sample], *, batches: bool, attention: bool, context: bool = True
         ) -> tuple[LinearCoefficients, float]:
    names = ["a", "b", "c", "d", "e", "overhead"]
    if not batches:
        names.remove("c")
    if not context:
        names.remove("d")
    if not attention:
        names.remove("e")
    rows, ys = [], []
    kinds = {s.kind for s in samples}
    scale = {k: statistics.fmean(s.step_ms for s in samples if s.kind == k) or 1.0 for k in kinds}
    for s in samples:
        full = _features(s)
        w = 1.0 / scale[s.kind]  # TTFT and TPOT rows count alike (see fit)
        rows.append([w * full[k] for k in names])
        ys.append(w * s.step_ms)
    cols = len(names)
    if len(rows) < cols:
        raise UsageError(f"calibrate: {len(rows)} design points cannot fit {cols} constants")
    # least absolute deviations by iteratively reweighted least squares: each row weighs 1/|residual|
    weights = [1.0] * len(rows)
    for _ in range(LAD_ROUNDS):
        ata = [[sum(w * r[i] * r[j] for r, w in zip(rows, weights, strict=True)) for j in range(cols)]
               for i in range(cols)]
        aty = [sum(w * r[i] * y for r, y, w in zip(rows, ys, weights, strict=True)) for i in range(cols)]
        coefs = solve(ata, aty)
        weights = [1.0 / max(abs(y - sum(c * v for c, v in zip(coefs, r, strict=True))), LAD_FLOOR)
                   for r, y in zip(rows, ys, strict=True)]
    x = dict(zip(names, coefs, strict=True))
    return LinearCoefficients(a_ms=x["a"], b_ms=x["b"], c_ms=x.get("c", 0.0), d_ms=x.get("d", 0.0),
                              e_ms=x.get("e", 0.0)), x["overhead"]


async def calibrate(url: str, **kw: object) -> Calibration:
    samples, batches = await measure(url, **kw)  # type: ignore[arg-type, misc]
    coef, overhead = fit(samples, batches=batches)
    return Calibration(linear=coef, ttft_overhead_ms=overhead, max_num_seqs=None if batches else 1,
                       samples=samples)


def fit_spread(cal: Calibration) -> dict[str, tuple[float, float]]:
    """How far the design requests lie from the fitted model, per kind ("TTFT", "TPOT"): the median and
    p90 of |measured ÷ model − 1|. Much above a few % means the server's speed moved during the run."""
    errors: dict[str, list[float]] = {}
    for s in cal.samples:
        model = model_ms(cal.linear, cal.ttft_overhead_ms, s)
        if model > 0:
            errors.setdefault("TTFT" if s.kind == "prefill" else "TPOT", []).append(abs(s.step_ms / model - 1))
    for v in errors.values():
        v.sort()
    return {k: (percentile(v, 50), percentile(v, 90)) for k, v in errors.items()}


def spread_text(spread: dict[str, tuple[float, float]]) -> str:
    """`fit_spread`'s figures in a line (the CLI's output and the TOML's comment)."""
    return "; ".join(f"{k} of the design requests within {p50:.1%} of the model (median), {p90:.1%} (p90)"
                     for k, (p50, p90) in spread.items())


def to_toml(cal: Calibration, url: str, spread: dict[str, tuple[float, float]] | None = None) -> str:
    """The `slogate sim --config` file of a calibration; its comment holds the fit spread (`fit_spread`,
    computed here unless the caller has it)."""
    c = cal.linear
    lines = [f"# slogate sim calibrate --target {url}: step ms = A + B·new_tokens + C·seqs + D·kv_tokens"
             " + E·attn_work",
             f"# client-side TTFT overhead {cal.ttft_overhead_ms:.3f} ms (not part of the engine step)",
             f"# {spread_text(spread if spread is not None else fit_spread(cal))}",
             "# design samples, one per request (kind, new_tokens, seqs, kv_tokens, measured ms):"]
    lines += [f"#   {s.kind} {s.new_tokens} {s.seqs} {s.kv_tokens} {s.step_ms:.3f}" for s in cal.samples]
    lines += ["[sim]", 'timing = "linear"', "jitter = 0.0"]
    if cal.max_num_seqs is not None:
        lines.append(f"max_num_seqs = {cal.max_num_seqs}  # the target ran one request at a time")
    lines += ["[sim.linear]", f"a_ms = {c.a_ms!r}", f"b_ms = {c.b_ms!r}", f"c_ms = {c.c_ms!r}",
              f"d_ms = {c.d_ms!r}", f"e_ms = {c.e_ms!r}", ""]
    return "\n".join(lines)


EXAMPLES = """examples:
  slogate sim calibrate --target http://127.0.0.1:8000 --out gpu.toml
  slogate sim --config gpu.toml --port 8001          # the calibrated engine behind the OpenAI API
  slogate plan trace.jsonl --slo ttft=1,tpot=0.1 --candidates 'l4/llama-3-8b?config=gpu.toml'  # plan with it
  slogate sim calibrate --target http://127.0.0.1:8080 --prompt-tokens 16,64,128 --batches 1 --repeats 5
"""


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="slogate sim calibrate", description="Fit the simulator's linear step "
                                "model to a running OpenAI-compatible server; write a TOML for `slogate sim --config`.",
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="base URL of the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="model id to send (default: none, the server's only model)")
    p.add_argument("--out", default="sim-calibrated.toml", help="TOML to write (default sim-calibrated.toml)")
    p.add_argument("--prompt-tokens", default=",".join(map(str, DESIGN_PROMPTS)),
                   help="prefill design sizes in words (the fit counts tokens: the server's usage, else its "
                        "tokenize endpoint, else words; default %(default)s)")
    p.add_argument("--batches", default="1,4,8", help="decode concurrencies")
    p.add_argument("--long-context", type=int, default=2048,
                   help="context (words) of the long-context decode point; 0: none, the design prompts' own "
                        "decodes give the cost per context token (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3,
                   help="requests per design point (each one a sample of the median-line fit)")
    ns = p.parse_args(argv)
    try:
        sizes = tuple(int(x) for x in ns.prompt_tokens.split(","))
        batches = tuple(int(x) for x in ns.batches.split(","))
    except ValueError:
        raise UsageError("--prompt-tokens and --batches take comma-separated integers, e.g. 16,256,1024") from None
    if ns.long_context < 0:
        raise UsageError(f"--long-context {ns.long_context} is negative; give words of context, or 0 for none")
    if not ns.target.startswith(("http://", "https://")):
        raise UsageError(f"--target {ns.target!r} is not a URL; use e.g. http://127.0.0.1:8000")
    cal = asyncio.run(calibrate(ns.target, model=ns.model, prompt_words=sizes, batches=batches,
                                long_words=ns.long_context, repeats=ns.repeats))
    spread = fit_spread(cal)
    Path(ns.out).write_text(to_toml(cal, ns.target, spread))
    c = cal.linear
    print(f"slogate sim calibrate: step ms = {c.a_ms:.4g} + {c.b_ms:.4g}·new_tokens + {c.c_ms:.4g}·seqs + "
          f"{c.d_ms:.4g}·kv_tokens + {c.e_ms:.3g}·attn_work; wrote {ns.out} (use: slogate sim --config {ns.out})", file=sys.stderr)
    print(f"slogate sim calibrate: {spread_text(spread)}", file=sys.stderr)
    worst = max((p50 for p50, _ in spread.values()), default=0.0)
    if worst > NOISY:
        print(f"slogate sim calibrate: warning: the median request is {worst:.0%} off the model: the server's speed "
              "moved during the run (other load on it?); calibrate again on a quiet server or raise --repeats",
              file=sys.stderr)
    return 0
