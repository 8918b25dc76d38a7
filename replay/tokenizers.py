"""Counting prompt tokens on the target's tokenizer: server `/tokenize`, a local file, or usage calibration.

Each counter answers `count(text)` (completions prompt) and `count_chat(text)` (one user message,
template included) or None when it cannot. Used only before a run (prompt calibration); never on
the sending path. `tokenizers` is optional and imported lazily.
"""

from __future__ import annotations

from typing import Protocol

import aiohttp

from slogate.traces.usage import UsageError


class TokenCounter(Protocol):
    name: str
    traffic: dict[str, int]  # requests sent to the target, by kind (results.json environment.warmup_traffic)

    async def count(self, text: str) -> int: ...

    async def count_chat(self, text: str) -> int | None: ...


def _count_of(obj: object) -> int | None:
    if isinstance(obj, dict):
        if isinstance(obj.get("count"), int):
            return obj["count"]
        if isinstance(obj.get("tokens"), list):
            return len(obj["tokens"])
    return None


class ServerTokenizer:
    """vLLM / SGLang / slogate sim: POST /tokenize {"model","prompt"|"messages"} → {"count"|"tokens"};
    llama-cpp-python: POST /extras/tokenize {"input"} → {"tokens"}."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str | None, path: str, headers: dict[str, str]):
        self.session, self.base, self.model, self.path, self.headers = session, base_url, model, path, headers
        self.name = f"server:{path}"
        self._chat_ok = True
        self.traffic: dict[str, int] = {}

    async def _post(self, body: dict) -> int | None:
        self.traffic["tokenize"] = self.traffic.get("tokenize", 0) + 1
        async with self.session.post(self.base + self.path, json=body, headers=self.headers) as resp:
            if resp.status != 200:
                return None
            return _count_of(await resp.json(content_type=None))

    async def count(self, text: str) -> int:
        body = {"model": self.model, "input": text} if self.path == "/extras/tokenize" else {"model": self.model, "prompt": text}
        n = await self._post(body)
        if n is None:
            raise UsageError(f"{self.base}{self.path} did not return a token count; pass --tokenizer calibrate")
        return n

    async def count_chat(self, text: str) -> int | None:
        if not self._chat_ok or self.path == "/extras/tokenize":
            return None
        n = await self._post({"model": self.model, "messages": [{"role": "user", "content": text}]})
        if n is None:
            self._chat_ok = False
        return n


async def probe_server_tokenizer(session: aiohttp.ClientSession, base_url: str, model: str | None,
                                 headers: dict[str, str], traffic: dict[str, int] | None = None) -> ServerTokenizer | None:
    """The server's tokenize endpoint when it has a working one (calls counted in `traffic`)."""
    traffic = {} if traffic is None else traffic
    for path in ("/tokenize", "/extras/tokenize"):
        tok = ServerTokenizer(session, base_url, model, path, headers)
        tok.traffic = traffic
        try:
            body = {"model": model, "input": "Text: the"} if path == "/extras/tokenize" else {"model": model, "prompt": "Text: the"}
            if await tok._post(body) is not None:
                return tok
        except (TimeoutError, aiohttp.ClientError, ValueError):
            continue
    return None


class FileTokenizer:
    """A local HuggingFace `tokenizer.json` (needs the optional `tokenizers` package)."""

    def __init__(self, path: str):
        try:
            from tokenizers import Tokenizer  # optional; never a dependency
        except ImportError:
            raise UsageError(f"--tokenizer {path} needs the 'tokenizers' package: pip install tokenizers") from None
        try:
            self._tok = Tokenizer.from_file(path)
        except Exception as exc:  # the library raises its own exception types
            raise UsageError(f"cannot load tokenizer file {path}: {exc}") from None
        self.name = f"file:{path}"
        self.traffic: dict[str, int] = {}  # a local file sends nothing
        self.added = 0  # tokens the target adds that the file does not (its BOS), once measured on the target

    async def count(self, text: str) -> int:
        return len(self._tok.encode(text).ids) + self.added

    async def count_chat(self, text: str) -> int | None:
        return None  # no chat template in a tokenizer file: calibrated from usage instead


class UsageCounter:
    """No tokenizer: send a 1-token request and read `usage.prompt_tokens` (calibration)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str | None, headers: dict[str, str]):
        self.session, self.base, self.model, self.headers = session, base_url, model, headers
        self.name = "calibrated"
        self.traffic: dict[str, int] = {}

    async def _usage(self, path: str, body: dict) -> int | None:
        kind = "calibration_chat" if path.endswith("chat/completions") else "calibration_completion"
        self.traffic[kind] = self.traffic.get(kind, 0) + 1
        body = {"model": self.model, "max_tokens": 1, "stream": False, **body}
        async with self.session.post(self.base + path, json=body, headers=self.headers) as resp:
            if resp.status != 200:
                return None
            obj = await resp.json(content_type=None)
        usage = obj.get("usage") if isinstance(obj, dict) else None
        n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return n if isinstance(n, int) else None

    async def count(self, text: str) -> int:
        n = await self._usage("/v1/completions", {"prompt": text})
        if n is None:
            raise UsageError(f"{self.base}/v1/completions gave no usage.prompt_tokens to calibrate prompt lengths; "
                             "pass --tokenizer FILE")
        return n

    async def count_chat(self, text: str) -> int | None:
        return await self._usage("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]})
