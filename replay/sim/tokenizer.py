"""The simulator's deterministic built-in tokenizer (about 4 characters per token) and output words.

Rule: a token is up to 4 non-space characters plus the whitespace before them; trailing whitespace
is one more token. So `" ".join(words)` with every word 1–4 non-space characters (e.g. "abcd") has
exactly len(words) tokens. A chat prompt adds 4 tokens per message and 3 for the reply header.
Used for /tokenize, usage.prompt_tokens and context checks alike; it never calls a real tokenizer.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

_PIECE = re.compile(r"\s*\S{1,4}|\s+")

CHAT_MESSAGE_TOKENS = 4  # <start> role <sep> … <eot>
CHAT_REPLY_TOKENS = 3  # <start> assistant <sep>

# generated text: short words, each exactly one token ("word" first, " word" after)
WORDS = (
    "the", "a", "of", "to", "and", "in", "is", "it", "you", "that", "was", "for", "on", "are",
    "with", "as", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by",
    "hot", "word", "but", "what", "some", "we", "can", "out", "were", "all", "when", "up", "use",
    "your", "how", "said", "an", "each", "she", "do", "time", "if", "will", "way", "many", "then",
    "them", "sing", "long", "make", "thin", "more", "day", "go", "see", "two", "has", "look", "who",
    "may", "part",
)
WORD_BYTES = tuple(w.encode() for w in WORDS)
SPACE_WORD_BYTES = tuple(b" " + w for w in WORD_BYTES)


def pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


def count(text: str) -> int:
    return len(_PIECE.findall(text))


def content_text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return str(content)


def chat_pieces(messages: Iterable[Mapping[str, Any]], add_generation_prompt: bool = True) -> list[str]:
    """Token pieces of a chat prompt after the built-in template."""
    out: list[str] = []
    for m in messages:
        out += ["<|start|>", str(m.get("role", "user")), "<|sep|>"]
        out += pieces(content_text(m.get("content")))
        out.append("<|eot|>")
    if add_generation_prompt:
        out += ["<|start|>", "assistant", "<|sep|>"]
    return out


def token_ids(ps: Iterable[str], vocab: int) -> list[int]:
    return [zlib.crc32(p.encode()) % vocab for p in ps]


def detokenize(ids: Iterable[int], vocab: int) -> str:
    """Text for token ids: ids of generated words map back to them, any other id to some word."""
    table = _reverse(vocab)
    return "".join(table.get(i, " " + WORDS[i % len(WORDS)]) for i in ids)


_REVERSE: dict[int, dict[int, str]] = {}


def _reverse(vocab: int) -> dict[int, str]:
    if vocab not in _REVERSE:
        table: dict[int, str] = {}
        for w in WORDS:
            for p in (w, " " + w):
                table.setdefault(zlib.crc32(p.encode()) % vocab, p)
        _REVERSE[vocab] = table
    return _REVERSE[vocab]


def output_text(start: int, n: int) -> str:
    """The n generated words of a request whose word sequence starts at `start`."""
    nw = len(WORDS)
    return "".join(WORDS[(start + k) % nw] if k == 0 else " " + WORDS[(start + k) % nw] for k in range(n))
