"""Prompt synthesis to an exact token count on the target's tokenizer, with production prefix sharing.

A prompt is words, each one token on the target with its leading space (checked by `calibrate`;
an anchor `Text:` goes first when a chat template would trim the leading space), so counts add up
at any boundary. Hash block `h` always yields the same words for a
seed, so equal ids give equal text and prefix caching behaves as in the trace. Never sees or
stores real prompt text; calibration talks to the tokenizer only before a run.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import msgspec

from slogate.replay.tokenizers import TokenCounter
from slogate.replay.workload import PlannedRequest

ANCHOR = "Text:"
WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his", "her", "are", "be", "this", "which", "or", "an", "had", "not", "but", "have", "they", "you", "were", "their", "one", "all", "we", "can", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no", "out", "up", "into", "do", "time", "only", "new", "some", "could", "these", "two", "may", "first", "then", "any", "like", "other", "than", "its", "now", "my", "over", "such", "our", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before", "must", "well", "back", "through", "years", "much", "where", "your", "way", "down", "should", "because", "each", "just", "those", "people", "how", "too", "little", "state", "good", "very", "make", "world", "still", "own", "see", "men", "work", "long", "get", "here", "between", "both", "life", "being", "under", "never", "day", "same", "another", "know", "while", "last", "might", "us", "great", "old", "year", "off", "come", "since", "against", "go", "came", "right", "used", "take", "three", "home", "water", "room", "mother", "far", "air", "line", "area", "music", "book", "word", "end", "week", "ten", "girl", "city", "group", "game", "point", "hand", "part", "place", "case", "number", "night", "week", "fact", "eye", "job", "side", "head", "house", "service", "friend", "power", "hour", "end", "kind", "body", "face", "others", "level", "war", "car", "party", "form", "team", "rate", "door", "health", "art", "war", "law", "boy", "food", "road", "red", "blue", "green", "black", "white"]
BLOCK_CACHE_SIZE = 8192  # hash blocks whose word lists are kept (a 512-token block is ~3 KB)


class PromptPlan(msgspec.Struct):
    """Everything a worker needs to build prompts (picklable, no network handle)."""

    vocab: list[str]  # words that are exactly one token (with their leading space) on the target
    base_tokens: int  # tokens the target adds around the words (BOS, anchor, chat template)
    anchor: str = ""  # fixed text before the words ("Text:" when the bare words do not add up)
    seed: int = 0
    block_size: int = 512
    tokenizer: str = "none"  # where the counts came from: "server:/tokenize", "file:…", "calibrated"
    exact: bool = True  # additivity verified on the target's tokenizer
    anchor_tokens: int = 0  # tokens of the anchor alone (no BOS, no template): the `content` convention's base
    added_tokens: int | None = None  # `content`: tokens the target adds to the content (BOS, template); None: unknown


class PromptBuilder:
    """Builds the prompt text of a planned request (cached per hash block).

    Words are drawn from SHAKE-128 of the block's (or the request's) key: one byte per word scaled to
    the vocabulary, the same on every worker and platform, ~4x cheaper than seeding a `random.Random`
    per request (on the replay's send path)."""

    def __init__(self, plan: PromptPlan):
        self.plan = plan
        self._vocab = [" " + w for w in plan.vocab]
        n = len(self._vocab)
        self._wide = n > 256  # more words than a byte can pick: two bytes per word
        self._table = None if self._wide else bytes((b * n) >> 8 for b in range(256))
        self._blocks: OrderedDict[int, list[str]] = OrderedDict()

    def _draw(self, key: str, k: int) -> list[str]:
        """`k` words from the stream of `key`."""
        vocab = self._vocab
        if self._table is None:
            raw = hashlib.shake_128(key.encode()).digest(2 * k)
            n = len(vocab)
            return [vocab[int.from_bytes(raw[i:i + 2]) % n] for i in range(0, 2 * k, 2)]
        return list(map(vocab.__getitem__, hashlib.shake_128(key.encode()).digest(k).translate(self._table)))

    def content_tokens(self, req: PlannedRequest) -> int:
        return max(0 if self.plan.anchor or self.plan.base_tokens else 1, req.input_tokens - self.plan.base_tokens)

    def block_words(self, h: int, n: int) -> list[str]:
        """The first `n` words of hash block `h` (the same for every request and worker)."""
        words = self._blocks.get(h)
        if words is None or len(words) < n:
            words = self._draw(f"{self.plan.seed}:{h}", max(n, self.plan.block_size))
            self._blocks[h] = words
            if len(self._blocks) > BLOCK_CACHE_SIZE:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(h)
        return words if n == len(words) else words[:n]

    def words(self, req: PlannedRequest) -> list[str]:
        n = self.content_tokens(req)
        bs = req.block_size or self.plan.block_size
        out: list[str] = []
        for h in req.hash_ids or ():
            if len(out) >= n:
                break
            out += self.block_words(h, min(bs, n - len(out)))
        if len(out) < n:  # tokens past the shared blocks: unique to this request
            out += self._draw(f"{self.plan.seed}:u:{req.seed_key if req.seed_key is not None else req.index}",
                              n - len(out))
        return out

    def text(self, req: PlannedRequest) -> str:
        return self.plan.anchor + "".join(self.words(req))


async def select_vocab(counter: TokenCounter, candidates: list[str], base: int, anchor: str) -> list[str]:
    """The candidates that are exactly one token each, found by bisection (few tokenizer calls)."""

    async def check(group: list[str]) -> list[str]:
        n = await counter.count(anchor + "".join(" " + w for w in group))
        if n - base == len(group):
            return group
        if len(group) == 1:
            return []
        mid = len(group) // 2
        left, right = await asyncio.gather(check(group[:mid]), check(group[mid:]))
        return left + right

    return await check(list(dict.fromkeys(candidates)))


async def calibrate(counter: TokenCounter, *, chat: bool, seed: int, block_size: int,
                    chat_counter: TokenCounter | None = None, server_counter: TokenCounter | None = None) -> PromptPlan:
    """Find the one-token vocabulary and the constant overhead on the target, and verify additivity.

    Overhead = count(anchor + n words) − n; it is measured at two lengths for the endpoint in use
    (chat adds the template). Additivity is checked on a prompt built from two hash blocks. Bare
    words are tried first; the `Text:` anchor only when they do not add up. `server_counter` (a local
    tokenizer file's run): the completions overhead is measured on the target too, which may add a BOS
    the file does not.
    """
    plan = None
    for anchor in ("", ANCHOR):
        plan = await _try(counter, anchor, chat=chat, seed=seed, block_size=block_size, chat_counter=chat_counter,
                          server_counter=server_counter)
        if plan.exact:
            return plan
    assert plan is not None
    return plan


async def _try(counter: TokenCounter, anchor: str, *, chat: bool, seed: int, block_size: int,
               chat_counter: TokenCounter | None, server_counter: TokenCounter | None) -> PromptPlan:
    base0 = await counter.count(anchor) if anchor else await counter.count("")
    special = await _special_tokens(counter) if anchor else base0
    vocab = await select_vocab(counter, list(WORDS), base0, anchor)
    if len(vocab) < 16:
        vocab = list(WORDS)  # the target splits words oddly: build anyway, report drift
    plan = PromptPlan(vocab=vocab, base_tokens=base0, anchor=anchor, seed=seed, block_size=block_size,
                      tokenizer=counter.name, anchor_tokens=max(0, base0 - special))
    probe = PromptBuilder(plan)
    sample = PlannedRequest(t=0, input_tokens=base0 + block_size + block_size // 2 + 7, output_tokens=1,
                            hash_ids=[1 << 62, (1 << 62) + 1])
    exact = len(vocab) >= 16 and await counter.count(probe.text(sample)) == sample.input_tokens
    if chat:
        overhead = await _chat_overhead(chat_counter or counter, probe, block_size)
    elif server_counter is not None:  # the words count alike; what the target adds around them may not
        overhead = await _overhead(server_counter.count, probe, block_size)
    else:
        overhead = None
    if overhead is not None:
        plan.base_tokens, exact = overhead[0], exact and overhead[1]
    elif chat:
        exact = False  # the template could not be measured: server lengths are off by it
    plan.exact = exact
    return plan


async def _special_tokens(counter: TokenCounter) -> int:
    """Tokens the target adds to any prompt (BOS): the count of an empty prompt (0 when it cannot say)."""
    from slogate.traces.usage import UsageError

    try:
        return await counter.count("")
    except UsageError:
        return 0


def content_convention(plan: PromptPlan, added_tokens: int | None) -> PromptPlan:
    """The plan whose request lengths count the message content only (AIPerf, guidellm, vllm bench):
    the target's BOS and chat template come on top (`added_tokens`, when measured), so the server's
    prompt_tokens is larger by them."""
    return msgspec.structs.replace(plan, base_tokens=plan.anchor_tokens, added_tokens=added_tokens)


async def content_added_tokens(counter: TokenCounter, plan: PromptPlan, *, chat: bool | None) -> int | None:
    """What the target adds to a content-convention prompt: for completions its BOS (known from the
    calibrated plan); for chat (`chat` True) its template too, measured as calibration measures it
    (`chat` None: chat, but no calibration chats allowed, so unknown)."""
    if chat is None:
        return None
    if not chat:
        return max(0, plan.base_tokens - plan.anchor_tokens)
    overhead = await _chat_overhead(counter, PromptBuilder(plan), plan.block_size)
    return None if overhead is None or not overhead[1] else max(0, overhead[0] - plan.anchor_tokens)


async def _chat_overhead(counter: TokenCounter, probe: PromptBuilder, block_size: int) -> tuple[int, bool] | None:
    """(template overhead, constant across lengths) for one user message."""
    return await _overhead(counter.count_chat, probe, block_size)


async def _overhead(count: Callable[[str], Awaitable[int | None]], probe: PromptBuilder,
                    block_size: int) -> tuple[int, bool] | None:
    """(tokens added around the words, constant across lengths): `count` of the anchor and n words, minus n,
    at two lengths."""
    texts = [probe.plan.anchor + "".join(probe.block_words(1 << 61, k)) for k in (8, min(block_size, 200))]
    counts = [await count(t) for t in texts]
    if counts[0] is None or counts[1] is None:
        return None
    o1, o2 = counts[0] - 8, counts[1] - min(block_size, 200)
    return o1, o1 == o2


async def verify(counter: TokenCounter, plan: PromptPlan, requests: list[PlannedRequest], *, chat: bool,
                 content: bool, sample: int = 8) -> tuple[int, int] | None:
    """(exact, checked): the lengths of up to `sample` prompts spread over the workload, counted on the
    target's tokenizer as the convention counts them (content: without BOS and template; server: as
    the server does). None when this counter cannot count that way (a file has no chat template)."""
    if not requests:
        return None
    builder = PromptBuilder(plan)
    picked = requests[:: max(1, len(requests) // sample)][:sample]
    special = await _special_tokens(counter) if content else 0
    exact = 0
    for req in picked:
        text = builder.text(req)
        n = await counter.count_chat(text) if chat and not content else await counter.count(text) - special
        if n is None:
            return None
        exact += n == plan.base_tokens + builder.content_tokens(req)
    return exact, len(picked)
