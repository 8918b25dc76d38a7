"""Forcing the recorded output length: which request fields make the target generate exactly N tokens.

`--force-output auto|ignore_eos|min_tokens|logit-bias:JSON|none`. `auto` picks by server kind
(vLLM/SGLang/slogate sim: ignore_eos; llama.cpp: ban Gemma's end tokens, DESIGN §7; unknown:
none). Pure: never sends a request; a backend that cannot be forced is reported, not hidden.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from slogate.traces.usage import UsageError

# llama.cpp serving Gemma 3: <eos>, <end_of_turn>, </s> (ignore_eos / min_tokens are ignored there)
GEMMA_END_TOKENS = {"1": -100, "106": -100, "212": -100}


class Forcing(msgspec.Struct, frozen=True):
    mode: str  # "ignore_eos", "min_tokens", "ignore_eos+min_tokens", "logit_bias", "none"
    logit_bias: dict[str, float] | None = None

    def fields(self, output_tokens: int) -> dict[str, Any]:
        """Body fields for a request that must produce `output_tokens` tokens."""
        out: dict[str, Any] = {"max_tokens": output_tokens}
        if "ignore_eos" in self.mode:
            out["ignore_eos"] = True
        if "min_tokens" in self.mode:
            out["min_tokens"] = output_tokens
        if self.mode == "logit_bias" and self.logit_bias:
            out["logit_bias"] = self.logit_bias
        return out


def choose(spec: str, server_kind: str) -> Forcing:
    """Resolve `--force-output` against the probed server kind."""
    s = spec.strip()
    if s == "auto":
        if server_kind in ("vllm", "slogate-sim"):
            return Forcing("ignore_eos+min_tokens" if server_kind == "vllm" else "ignore_eos")
        if server_kind == "sglang":
            return Forcing("ignore_eos")
        if server_kind == "llamacpp":
            return Forcing("logit_bias", GEMMA_END_TOKENS)
        return Forcing("none")
    if s in ("ignore_eos", "min_tokens", "none", "ignore_eos+min_tokens"):
        return Forcing(s)
    if s.startswith(("logit-bias:", "logit_bias:")):
        raw = s.split(":", 1)[1]
        try:
            bias = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise UsageError(f"bad --force-output {spec!r}: expected logit-bias:JSON, e.g. logit-bias:'{{\"1\": -100}}'") from None
        if not _token_bias(bias):  # a key like "abc" failed every request on llama.cpp (HTTP 500)
            raise UsageError(f"bad --force-output {spec!r}: the JSON must map token ids (whole numbers ≥ 0) "
                             "to numbers, e.g. logit-bias:'{\"1\": -100}'")
        return Forcing("logit_bias", {str(int(k)): float(v) for k, v in bias.items()})
    raise UsageError(f"bad --force-output {spec!r}: use auto, ignore_eos, min_tokens, logit-bias:JSON or none")


def _token_bias(bias: object) -> bool:
    """A non-empty {token id: number} map (ids as the JSON object's keys, numbers not booleans)."""
    return (isinstance(bias, dict) and bool(bias)
            and all(k.strip().isascii() and k.strip().isdigit() and isinstance(v, int | float) and not isinstance(v, bool)
                    for k, v in bias.items()))
