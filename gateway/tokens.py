"""Exact input tokens when the upstream sends no usage: the model's tokenizer counts the prompt, off the hot path.

A finished record whose `input_tokens` is the bytes/4 estimate is queued with its parsed request body;
a background task counts batches (what is queued within 20 ms of the first) with a local
`tokenizer.json` (the `tokenizers` package, in a thread) or the server's tokenize endpoint, fixes the
record, then hands it to the Recorder (so such a record reaches /metrics ~20 ms after its response
ended). The relay never waits on it; a full queue or a failed count records the estimate as before. Never logs or keeps text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from slogate.traces.record import RequestRecord
from slogate.traces.usage import UsageError

log = logging.getLogger("slogate.gateway")
BATCH = 64
# A batch is counted this long after its first record came: more records per count under load, and
# the count (in a thread, at the gateway's priority) never lands on the moment a client reads the end
# of the response it just got (on a shared core that added ~1.2 ms to guidellm's E2E, issue 20).
BATCH_WINDOW_S = 0.02
TEMPLATES = ("none", "gemma", "chatml", "llama3")
_ROLES = {
    "gemma": ("<start_of_turn>{role}\n{content}<end_of_turn>\n", "<start_of_turn>model\n", {"assistant": "model"}),
    "chatml": ("<|im_start|>{role}\n{content}<|im_end|>\n", "<|im_start|>assistant\n", {}),
    "llama3": ("<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>",
               "<|start_header_id|>assistant<|end_header_id|>\n\n", {}),
}
Done = Callable[[RequestRecord, Any], None]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only the text ones count here
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def render(body: Any, template: str) -> tuple[str, bool] | None:
    """(prompt text, template applied) of a chat or completions body; None when there is no text prompt.
    `template` none: the message contents alone (the count then stays flagged estimated for chats)."""
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("prompt"), str):
        return body["prompt"], True
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        return None
    if template == "none":
        return "".join(_text(m.get("content")) for m in msgs if isinstance(m, dict)), False
    turn, reply, roles = _ROLES[template]
    parts = []
    for m in msgs:
        if isinstance(m, dict):
            role = str(m.get("role", "user"))
            parts.append(turn.format(role=roles.get(role, role), content=_text(m.get("content"))))
    return "".join(parts) + reply, True


class GatewayTokens:
    """The counting queue: `submit` (event loop, non-blocking) → counted → `done(record, body)`."""

    def __init__(self, tokenizer: str, template: str = "none", queue_size: int = 4096) -> None:
        if template not in TEMPLATES:
            raise UsageError(f"gateway.tokens.template {template!r}: use one of {', '.join(TEMPLATES)}")
        self.template = template
        self.url = tokenizer if tokenizer.startswith(("http://", "https://")) else None
        self._tok = None if self.url else _load(tokenizer)
        self._queue: asyncio.Queue[tuple[RequestRecord, Any, Done]] = asyncio.Queue(queue_size)
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None
        self.counted = self.failed = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def submit(self, record: RequestRecord, body: Any, done: Done) -> None:
        """Queue an estimated record; when the queue is full it is recorded as estimated at once."""
        try:
            self._queue.put_nowait((record, body, done))
        except asyncio.QueueFull:
            done(record, body)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while not self._queue.empty():  # shutting down: record what is left as estimated
            record, body, done = self._queue.get_nowait()
            done(record, body)
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(BATCH_WINDOW_S)
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                counts = await self._count([item[1] for item in batch])
            except asyncio.CancelledError:  # closing mid-count: this batch is recorded as estimated
                for record, body, done in batch:
                    done(record, body)
                raise
            except Exception as exc:  # the class only: an exception's text may quote what it was given
                log.warning("counting prompt tokens on %s failed (%s); the estimates are kept",
                            self.url or "the tokenizer file", type(exc).__name__, exc_info=False)
                counts = [None] * len(batch)
            for (record, body, done), count in zip(batch, counts, strict=True):
                if count is not None:
                    record.input_tokens, record.input_estimated = count[0], not count[1]
                    self.counted += 1
                else:
                    self.failed += 1
                done(record, body)

    async def _count(self, bodies: list[Any]) -> list[tuple[int, bool] | None]:
        if self._tok is not None:
            texts = [render(b, self.template) for b in bodies]
            return await asyncio.to_thread(self._encode, texts)
        return list(await asyncio.gather(*(self._post(b) for b in bodies)))

    def _encode(self, texts: list[tuple[str, bool] | None]) -> list[tuple[int, bool] | None]:
        assert self._tok is not None
        # One text at a time, not `encode_batch`: that one fans out to a rayon pool of one thread per
        # core whose idle workers spin, taking CPU from the relay and from whatever shares its cores.
        encode = self._tok.encode
        return [None if t is None else (len(encode(t[0]).ids), t[1]) for t in texts]

    async def _post(self, body: Any) -> tuple[int, bool] | None:
        """vLLM/SGLang `/tokenize` applies the template to `messages`; llama.cpp `/extras/tokenize` gets text."""
        assert self.url is not None
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        extras = self.url.endswith("/extras/tokenize")
        if not extras and isinstance(body, dict) and isinstance(body.get("messages"), list) and self.template == "none":
            payload: dict[str, Any] = {"model": body.get("model"), "messages": body["messages"]}
            applied = True
        else:
            rendered = render(body, self.template)
            if rendered is None:
                return None
            text, applied = rendered
            payload = {"input": text} if extras else {"model": body.get("model"), "prompt": text}
        async with self._session.post(self.url, json=payload) as resp:
            if resp.status != 200:
                return None
            obj = await resp.json(content_type=None)
        n = obj.get("count") if isinstance(obj, dict) else None
        if not isinstance(n, int) and isinstance(obj, dict) and isinstance(obj.get("tokens"), list):
            n = len(obj["tokens"])
        return (n, applied) if isinstance(n, int) else None


def _load(path: str):
    try:
        from tokenizers import Tokenizer  # optional extra `tokenizer`, only when configured
    except ImportError:
        raise UsageError(f"gateway.tokens.tokenizer {path!r} needs the 'tokenizers' package: "
                         "pip install 'slogate[tokenizer]'") from None
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # the library raises its own exception types
        raise UsageError(f"gateway.tokens.tokenizer {path!r}: cannot load ({exc}); give a tokenizer.json "
                         "or the server's tokenize URL") from None
