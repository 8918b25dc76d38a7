"""Service-level objectives and the definition of a *good* request (README "goodput").

An SLO is a set of upper bounds on TTFT, TPOT and E2E, written `ttft=0.5,tpot=50ms,e2e=30`
(seconds unless suffixed `ms`/`s`). A request is good when it succeeded (2xx, finished normally)
and meets every bound of that SLO. Errors and rejections are never good.
"""

from __future__ import annotations

import re

import msgspec

from slogate.traces.record import RequestRecord, is_error

_BOUND_KEYS = ("ttft", "tpot", "e2e")
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|us)?\s*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


class SloError(ValueError):
    """A malformed SLO specification (the message names the bad part and the expected form)."""


class Slo(msgspec.Struct, frozen=True, omit_defaults=True):
    """Upper bounds in seconds; None means unbounded."""

    name: str = "default"
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def spec(self) -> str:
        """The canonical text form, e.g. `ttft=0.5,tpot=0.05`."""
        parts = [f"{k}={getattr(self, k):g}" for k in _BOUND_KEYS if getattr(self, k) is not None]
        return ",".join(parts)


def parse_duration(text: str, *, what: str = "duration") -> float:
    """'0.5' → 0.5 s, '50ms' → 0.05 s, '2s' → 2.0 s."""
    m = _VALUE.match(text)
    if not m:
        raise SloError(f"bad {what} {text!r}: expected a number of seconds, or with a unit like '50ms' or '2s'")
    value = float(m.group(1))
    unit = m.group(2) or "s"
    return value * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit]


def parse_slo(text: str, *, default_name: str = "default") -> Slo:
    """Parse `[NAME:]ttft=0.5,tpot=50ms,e2e=30` into an Slo."""
    name = default_name
    body = text.strip()
    if ":" in body.split("=", 1)[0]:
        name, body = body.split(":", 1)
        name = name.strip()
        if not _NAME.match(name):
            raise SloError(f"bad SLO name {name!r} in {text!r}: use letters, digits, '_', '-', '.'")
    bounds: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in body.split(","))):
        if "=" not in part:
            raise SloError(f"bad SLO bound {part!r} in {text!r}: expected KEY=VALUE with KEY one of ttft, tpot, e2e")
        key, value = (s.strip().lower() for s in part.split("=", 1))
        if key not in _BOUND_KEYS:
            raise SloError(f"unknown SLO key {key!r} in {text!r}: use ttft, tpot or e2e")
        bound = parse_duration(value, what=f"SLO {key}")
        if bound <= 0:
            raise SloError(f"SLO {key} must be positive, got {value!r}")
        bounds[key] = bound
    if not bounds:
        raise SloError(f"empty SLO {text!r}: give at least one of ttft=, tpot=, e2e= (e.g. 'ttft=0.5,tpot=50ms')")
    return Slo(name=name, **bounds)


def is_good(record: RequestRecord, slo: Slo) -> bool:
    """Succeeded and met every bound. A bound whose metric is undefined (e.g. TTFT of a
    non-streaming request, TPOT of a 1-token answer) is not held against the request."""
    if is_error(record):
        return False
    for key in _BOUND_KEYS:
        bound = getattr(slo, key)
        if bound is None:
            continue
        value = getattr(record, key)
        if value is not None and value > bound:
            return False
    return True
