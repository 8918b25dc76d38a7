"""Plan candidates: `GPU/MODEL[?dtype=…&tp=…&replicas=…&max_num_seqs=…]`, `--grid KEY=V1,V2` and `--price`.

Pure parsing: a candidate is a catalog GPU and model plus simulator options (the same names as
`slogate sim`'s flags), or a `slogate sim --config` TOML (`config=FILE`, e.g. from `slogate sim calibrate`).
Never simulates; the only file it reads is such a config (its `[sim]` settings).
"""

from __future__ import annotations

import functools
import itertools
import math
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

import msgspec

from slogate.replay.plan.scaling import INTERCONNECTS, gpu_set
from slogate.replay.sim import catalog
from slogate.traces.usage import UsageError

# options a candidate may set (SimConfig fields); anything else is a typo
OPTIONS = ("dtype", "kv_dtype", "tp", "replicas", "max_num_seqs", "max_num_batched_tokens",
           "gpu_memory_utilization", "max_model_len", "scheduler", "prefix_caching", "timing", "ttft_ms", "itl_ms",
           "jitter", "seed", "interconnect", "host_step_ms", "host_seq_us", "host_kv_ns",
           "config")  # config=FILE: a `slogate sim --config` TOML, e.g. what `slogate sim calibrate` wrote
INT_OPTIONS = ("tp", "replicas", "max_num_seqs", "max_num_batched_tokens", "max_model_len")
NON_NEGATIVE = ("ttft_ms", "itl_ms", "jitter", "host_step_ms", "host_seq_us", "host_kv_ns")  # seconds-ish numbers ≥ 0
SCHEDULERS = ("v1", "v0")
ON = ("true", "on", "yes", "1")  # prefix_caching=… (the sim's only flag is --no-prefix-caching)
OFF = ("false", "off", "no", "0")


class Candidate(msgspec.Struct, frozen=True):
    """One deployment to plan: a GPU, a model and the engine options (strings, as `sim:` targets take them)."""

    gpu: str
    model: str
    opts: tuple[tuple[str, str], ...] = ()

    @property
    def options(self) -> dict[str, str]:
        return dict(self.opts)

    @property
    def spec(self) -> str:
        """The canonical name: `gpu/model?k=v&…` (keys in the order given)."""
        query = "&".join(f"{k}={v}" for k, v in self.opts)
        return f"{self.gpu}/{self.model}" + (f"?{query}" if query else "")

    @property
    def target(self) -> str:
        """The `--target` of the same engine (`sim:GPU/MODEL?…`, the interconnect as `gpu_set`)."""
        opts = {k: v for k, v in self.sim_options().items() if k not in ("gpu", "model")}
        query = urllib.parse.urlencode(opts, safe=",=")
        return f"sim:{self.gpu}/{self.model}" + (f"?{query}" if query else "")

    def sim_options(self) -> dict[str, str]:
        """`slogate sim` options (SimConfig names): `interconnect=` becomes the GPU's link fields."""
        opts = {"gpu": self.gpu, "model": self.model, **self.options}
        link = opts.pop("interconnect", None)
        if link is not None and (fields := gpu_set(self.gpu, link)) is not None:
            opts["gpu_set"] = fields
        if opts.pop("prefix_caching", "true").strip().lower() in OFF:
            opts["no_prefix_caching"] = ""  # a flag without a value (replay.target.sim_args)
        return opts

    def int_option(self, key: str, default: int) -> int:
        """The candidate's own value, else its config file's `[sim]` value (`?config=FILE`), else `default`."""
        opts = self.options
        if key in opts:
            return int(opts[key])
        if "config" in opts:
            value = _file_settings(opts["config"]).get(key)
            if isinstance(value, int):
                return value
        return default


@functools.lru_cache(maxsize=32)
def _file_settings(path: str) -> dict:
    """The `[sim]` table of a `slogate sim --config` TOML (checked when the candidate was parsed)."""
    table = msgspec.toml.decode(Path(path).read_bytes()).get("sim", {})
    return table if isinstance(table, dict) else {}


def parse_candidate(text: str) -> Candidate:
    path, _, query = text.strip().partition("?")
    gpu, sep, model = path.partition("/")
    if not sep or not gpu or not model:
        raise UsageError(f"bad candidate {text!r}: expected GPU/MODEL[?dtype=fp8&tp=2…], e.g. h100-sxm/llama-3-8b")
    catalog.find_gpu(gpu)
    catalog.find_model(model)
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise UsageError(f"bad candidate {text!r}: options are KEY=VALUE joined by &, e.g. ?dtype=fp8&tp=2") from None
    opts = [_option(text, k, v) for k, v in pairs]
    seen = [k for k, _ in opts]
    if twice := next((k for k in seen if seen.count(k) > 1), None):
        raise UsageError(f"bad candidate {text!r}: {twice} is given twice; give each option once")
    for k, v in opts:
        if k == "interconnect":
            gpu_set(gpu, v)  # nvlink on a GPU without it is an error now, not at plan time
    return Candidate(gpu=gpu.lower(), model=model.lower(), opts=tuple(opts))


def _option(text: str, key: str, value: str) -> tuple[str, str]:
    key = key.strip().replace("-", "_")
    if key not in OPTIONS:
        raise UsageError(f"bad candidate {text!r}: unknown option {key!r}; use: {', '.join(OPTIONS)}")
    if key in ("dtype", "kv_dtype"):
        catalog.precision(value)
    if key == "interconnect" and value.strip().lower() not in INTERCONNECTS:
        raise UsageError(f"bad candidate {text!r}: interconnect={value!r}; use one of {', '.join(INTERCONNECTS)}")
    if key == "config":
        from slogate.replay.sim.options import configure

        try:
            configure(["--config", value.strip()])  # read now: a missing or bad file fails before planning
        except UsageError as exc:
            raise UsageError(f"bad candidate {text!r}: {exc}") from None
    if key in INT_OPTIONS and (not value.isdigit() or int(value) < 1):
        raise UsageError(f"bad candidate {text!r}: {key}={value!r} must be a positive whole number")
    _check_value(text, key, value.strip())
    return key, value.strip()


def _number(text: str, key: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise UsageError(f"bad candidate {text!r}: {key}={value!r} must be a number")
    return number


def _check_value(text: str, key: str, value: str) -> None:
    """The value checks the simulator would make only once planning ran (or with its whole usage text)."""
    if key == "tp" and int(value) & (int(value) - 1):
        raise UsageError(f"bad candidate {text!r}: tp={value} is not supported; use 1, 2, 4 or 8")
    if key == "gpu_memory_utilization" and not 0.05 <= _number(text, key, value) <= 1:
        raise UsageError(f"bad candidate {text!r}: gpu_memory_utilization={value} must be a fraction in [0.05, 1], e.g. 0.9")
    if key in NON_NEGATIVE and _number(text, key, value) < 0:
        raise UsageError(f"bad candidate {text!r}: {key}={value} must be ≥ 0")
    if key == "seed" and not value.lstrip("-").isdigit():
        raise UsageError(f"bad candidate {text!r}: seed={value!r} must be a whole number")
    if key == "scheduler" and value.lower() not in SCHEDULERS:
        raise UsageError(f"bad candidate {text!r}: scheduler={value!r}; use one of {', '.join(SCHEDULERS)}")
    if key == "prefix_caching" and value.lower() not in ON + OFF:
        raise UsageError(f"bad candidate {text!r}: prefix_caching={value!r}; use true or false")


def check(cand: Candidate) -> None:
    """Parse the candidate's engine as `slogate sim` would, before planning: any mistake left (e.g. a
    timing the sim does not know) is one line naming the candidate, not the sim's usage text."""
    from slogate.replay.target import configured

    try:
        configured(cand.sim_options())
    except UsageError as exc:  # argparse's reason (SimOptionError) or the sim's own check
        raise UsageError(f"bad candidate {cand.spec!r}: {str(exc) or 'not a simulator option'}") from None


def parse_candidates(text: str) -> list[Candidate]:
    """Comma-separated candidates (a comma inside the options is not allowed: use --grid for lists)."""
    items = [c for c in text.split(",") if c.strip()]
    if not items:
        raise UsageError("--candidates is empty; e.g. --candidates h100-sxm/llama-3-8b,l4/llama-3-8b?dtype=int4")
    return [parse_candidate(c) for c in items]


def parse_grid(items: Sequence[str]) -> list[tuple[str, list[str]]]:
    """`--grid max_num_seqs=64,128` (repeatable) → [(key, values)] in the order given."""
    out: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, values = item.partition("=")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not vals:
            raise UsageError(f"bad --grid {item!r}: expected KEY=V1,V2,…, e.g. --grid max_num_seqs=64,128,256")
        key = key.strip().replace("-", "_")
        for v in vals:
            _option(f"--grid {item}", key, v)
        out.append((key, vals))
    return out


def expand(candidates: Sequence[Candidate], grid: Sequence[tuple[str, list[str]]]) -> list[Candidate]:
    """Every candidate × every grid combination (a grid key overrides the candidate's own value)."""
    if not grid:
        return list(candidates)
    out: list[Candidate] = []
    keys = [k for k, _ in grid]
    for cand in candidates:
        for combo in itertools.product(*(vals for _, vals in grid)):
            opts = {k: v for k, v in cand.opts if k not in keys}
            opts.update(zip(keys, combo, strict=True))
            out.append(Candidate(gpu=cand.gpu, model=cand.model, opts=tuple(opts.items())))
    return list(dict.fromkeys(out))  # a duplicate combination is planned once


def parse_prices(text: str | None) -> dict[str, float]:
    """`--price a100-80g=1.8,h100-sxm=3` → {gpu name (lower case): USD per GPU-hour}."""
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        gpu, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not sep or not 0 <= price < math.inf:
            raise UsageError(f"bad --price {item!r}: expected GPU=USD_PER_GPU_HOUR, e.g. --price h100-sxm=3,l4=0.8")
        out[catalog.find_gpu(gpu).name.lower()] = price
    return out
