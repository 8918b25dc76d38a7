"""Pool rules: which pool a request goes to, from its estimated prompt tokens and `max_tokens`.

A rule is `NAME: EXPR` where EXPR compares `prompt_tokens` / `max_tokens` with integers, joined by
`and` / `or` (`and` binds tighter), e.g. `long: prompt_tokens >= 4096 or max_tokens >= 2048`.
Parsed once into plain tuples (never `eval`); matching a request is a few integer comparisons.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence

from slogate.gateway.routing.upstreams import DEFAULT_POOL
from slogate.traces.usage import UsageError

VARIABLES = ("prompt_tokens", "max_tokens")
_OPS: dict[str, Callable[[int, int], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq, "!=": operator.ne,
}
_TOKEN = re.compile(r"\s*(>=|<=|==|!=|>|<|[A-Za-z_][A-Za-z0-9_]*|\d[\d_]*)")
_POOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")

Comparison = tuple[int, Callable[[int, int], bool], int]  # (variable index, op, constant)


class PoolRule:
    """One parsed rule: OR of AND-clauses of comparisons (disjunctive normal form)."""

    __slots__ = ("clauses", "pool", "text")

    def __init__(self, pool: str, clauses: list[list[Comparison]], text: str) -> None:
        self.pool = pool
        self.clauses = clauses
        self.text = text

    def matches(self, prompt_tokens: int, max_tokens: int) -> bool:
        values = (prompt_tokens, max_tokens)
        for clause in self.clauses:
            for var, op, const in clause:
                if not op(values[var], const):
                    break
            else:
                return True
        return False


def parse_rule(text: str) -> PoolRule:
    """`long: prompt_tokens >= 4096 or max_tokens >= 2048` -> PoolRule; UsageError names the rule."""
    def bad(why: str) -> UsageError:
        return UsageError(
            f"--pool {text!r}: {why}; write NAME: prompt_tokens >= 4096 or max_tokens >= 2048 "
            f"(variables {', '.join(VARIABLES)}; operators {' '.join(_OPS)}; joined by and/or)"
        )

    name, colon, expr = text.partition(":")
    name = name.strip()
    if not colon or not _POOL_NAME.match(name):
        raise bad("expected a pool name (letters, digits, _ . -) then ':'")
    if name == DEFAULT_POOL:
        raise bad(f"{DEFAULT_POOL!r} is the pool of requests no rule matches; name the rule's pool otherwise")
    tokens: list[str] = []
    pos = 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise bad(f"unexpected text {expr[pos:].strip()[:20]!r}")
        tokens.append(m.group(1))
        pos = m.end()
    if not tokens:
        raise bad("empty condition")
    clauses: list[list[Comparison]] = [[]]
    i = 0
    while True:
        if i + 3 > len(tokens):
            raise bad(f"incomplete comparison {' '.join(tokens[i:])!r}")
        var, op, const = tokens[i : i + 3]
        if var not in VARIABLES:
            raise bad(f"unknown variable {var!r}")
        if op not in _OPS:
            raise bad(f"expected a comparison operator after {var!r}, got {op!r}")
        if not const[0].isdigit():
            raise bad(f"expected an integer after {var} {op}, got {const!r}")
        clauses[-1].append((VARIABLES.index(var), _OPS[op], int(const.replace("_", ""))))
        i += 3
        if i == len(tokens):
            break
        joiner = tokens[i].lower()
        if joiner == "or":
            clauses.append([])
        elif joiner != "and":
            raise bad(f"expected 'and' or 'or', got {tokens[i]!r}")
        i += 1
    return PoolRule(name, clauses, text)


def parse_rules(texts: Sequence[str]) -> list[PoolRule]:
    rules = [parse_rule(t) for t in texts]
    seen: set[str] = set()
    for rule in rules:
        if rule.pool in seen:
            raise UsageError(f"--pool {rule.text!r}: pool {rule.pool!r} has two rules; join them with 'or'")
        seen.add(rule.pool)
    return rules


def pool_for(rules: Sequence[PoolRule], prompt_tokens: int, max_tokens: int) -> str:
    """The first matching rule's pool, else the default pool."""
    for rule in rules:
        if rule.matches(prompt_tokens, max_tokens):
            return rule.pool
    return DEFAULT_POOL


class TokenEstimator:
    """Prompt tokens from the request: `prompt_chars / bytes_per_token` (the default 4 matches
    `RequestInfo.est_input_tokens`), or a Hugging Face `tokenizer.json` when one is configured."""

    __slots__ = ("_tokenizer", "bytes_per_token")

    def __init__(self, bytes_per_token: float = 4.0, tokenizer_file: str | None = None) -> None:
        self.bytes_per_token = bytes_per_token
        self._tokenizer = None
        if tokenizer_file:
            try:
                from tokenizers import Tokenizer  # optional dependency, only when configured
            except ImportError:
                raise UsageError(
                    f"gateway.routing.tokenizer {tokenizer_file!r}: needs the 'tokenizers' package "
                    f"(pip install tokenizers), or drop the option to estimate bytes/{bytes_per_token:g}"
                ) from None
            try:
                self._tokenizer = Tokenizer.from_file(tokenizer_file)
            except Exception as exc:
                raise UsageError(f"gateway.routing.tokenizer {tokenizer_file!r}: cannot load ({exc})") from None

    @property
    def tokenizes(self) -> bool:
        return self._tokenizer is not None

    def prompt_tokens(self, prompt_chars: int) -> int:
        return int((prompt_chars + self.bytes_per_token - 1) // self.bytes_per_token)

    def count(self, prompt: bytes) -> int:
        """Tokens of the canonical prompt bytes with the configured tokenizer."""
        assert self._tokenizer is not None
        return len(self._tokenizer.encode(prompt.decode("utf-8", "replace"), add_special_tokens=False).ids)
