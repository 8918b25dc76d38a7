"""What the gateway and the router need to know about an OpenAI-style request body.

`request_info(path, body)` reads the already-decoded JSON body once: model, stream, max_tokens,
whether the client asked for streamed usage, embedding input count and a prompt-size estimate.
`prompt_bytes(body)` gives the canonical prompt bytes that anonymization hashes into prefix
blocks; it is called off the hot path (trace writer thread) and its result is never stored.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

MEASURED_ENDPOINTS = frozenset(
    {"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses"}
)
BYTES_PER_TOKEN = 4  # prompt-size estimate without a tokenizer


class RequestInfo(msgspec.Struct):
    """The few request fields slogate looks at; never any prompt text."""

    endpoint: str
    model: str | None = None
    stream: bool = False
    max_tokens: int | None = None
    include_usage: bool = False  # the client itself asked for stream_options.include_usage
    n_inputs: int | None = None  # embeddings
    prompt_chars: int = 0  # size of the prompt text, for the token estimate

    @property
    def est_input_tokens(self) -> int:
        return (self.prompt_chars + BYTES_PER_TOKEN - 1) // BYTES_PER_TOKEN


MAX_MODEL_BYTES = 256  # a longer `model` is cut (UTF-8 safe) before it reaches a trace, label or log


def _short_model(model: Any) -> str | None:
    if not isinstance(model, str):
        return None
    if len(model) <= MAX_MODEL_BYTES // 4:
        return model
    return model.encode("utf-8", "surrogatepass")[:MAX_MODEL_BYTES].decode("utf-8", "ignore")


def request_info(endpoint: str, body: Any) -> RequestInfo:
    """Read the fields of a decoded request body (a dict for well-formed requests)."""
    if not isinstance(body, dict):
        return RequestInfo(endpoint=endpoint)
    model = body.get("model")
    stream = body.get("stream") is True
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", body.get("max_output_tokens")))
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    n_inputs = None
    if endpoint.endswith("/embeddings"):
        inp = body.get("input")
        n_inputs = len(inp) if isinstance(inp, list) and inp and not isinstance(inp[0], int) else 1
    return RequestInfo(
        endpoint=endpoint,
        model=_short_model(model),
        stream=stream,
        max_tokens=max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None,
        include_usage=include_usage,
        n_inputs=n_inputs,
        prompt_chars=_prompt_size(body),
    )


def with_usage_requested(body: dict) -> bytes:
    """Re-encode a streaming request body with `stream_options.include_usage: true` added."""
    options = body.get("stream_options")
    new_options = dict(options) if isinstance(options, dict) else {}
    new_options["include_usage"] = True
    return orjson.dumps({**body, "stream_options": new_options})


def _prompt_size(body: dict) -> int:
    messages = body.get("messages")
    if isinstance(messages, list):
        return sum(_content_size(m.get("content")) for m in messages if isinstance(m, dict))
    for key in ("prompt", "input"):
        if key in body:
            return _content_size(body[key])
    return 0


def _content_size(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, str):
                total += len(part)
            elif isinstance(part, int):
                total += BYTES_PER_TOKEN  # a token id
            elif isinstance(part, dict):
                total += _content_size(part.get("text") or part.get("content"))
            elif isinstance(part, list):
                total += _content_size(part)
        return total
    return 0


def prompt_bytes(body: Any) -> bytes:
    """Canonical bytes of the prompt, in order: chat messages as role NUL content NUL, or the
    completion prompt / embedding input. Equal prompts give equal bytes; equal prefixes of the
    conversation give equal leading bytes (so prefix blocks line up)."""
    if not isinstance(body, dict):
        return b""
    parts: list[bytes] = []
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                parts.append(str(m.get("role", "")).encode())
                parts.append(b"\x00")
                _append_content(parts, m.get("content"))
                parts.append(b"\x00")
    else:
        for key in ("prompt", "input"):
            if key in body:
                _append_content(parts, body[key])
                break
    return b"".join(parts)


def _append_content(parts: list[bytes], content: Any) -> None:
    if isinstance(content, str):
        parts.append(content.encode("utf-8", "surrogatepass"))
    elif isinstance(content, int):
        parts.append(content.to_bytes(4, "little", signed=True))
    elif isinstance(content, list):
        for item in content:
            if isinstance(item, dict):
                _append_content(parts, item.get("text") or item.get("content"))
            else:
                _append_content(parts, item)
