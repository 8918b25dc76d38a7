"""OpenAI/vLLM wire shapes as bytes: SSE chunks (pre-encoded per request), bodies and error envelopes.

Shapes follow vLLM's OpenAI server: chat streams start with a role chunk, finish_reason rides on the
last delta, usage comes in a `"choices":[]` chunk, then `data: [DONE]`. No I/O and no timing here.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"


def new_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{os.urandom(16).hex()}"


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> bytes:
    """vLLM's error envelope."""
    return orjson.dumps({"error": {"message": message, "type": err_type, "param": param, "code": code}})


def error_event(message: str, err_type: str = "InternalServerError", code: int = 500) -> bytes:
    """An error after the stream started: one SSE event, followed by [DONE] by the caller."""
    return b"data: " + error_body(message, err_type, code) + b"\n\n"


def model_not_found(name: str) -> bytes:
    return error_body(f"The model `{name}` does not exist.", "NotFoundError", 404, "model")


def prompt_too_long(max_len: int, n_input: int) -> bytes:
    return error_body(
        f"This model's maximum context length is {max_len} tokens. However, your request has {n_input} "
        f"input tokens. Please reduce the length of the input messages.", "BadRequestError", 400)


def max_tokens_too_large(max_tokens: int, max_len: int, n_input: int) -> bytes:
    return error_body(
        f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
        f"length is {max_len} tokens and your request has {n_input} input tokens "
        f"({max_tokens} > {max_len} - {n_input}).", "BadRequestError", 400)


def usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    """vLLM's UsageInfo as a non-streaming body has it: `prompt_tokens_details` is null unless
    --enable-prompt-tokens-details is on and some prompt tokens were cached (vLLM tests `num_cached_tokens`
    for truth, so 0 cached tokens give null, not `{"cached_tokens": 0}`)."""
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached} if cached else None}


class ChunkCodec:
    """Pre-encoded pieces of one request's SSE chunks: head + token text + tail."""

    __slots__ = ("chat", "created", "head", "id", "model", "role", "tail")

    def __init__(self, kind: str, rid: str, created: int, model: str) -> None:
        self.chat = kind == "chat"
        self.id, self.created, self.model = rid, created, model
        m = orjson.dumps(model)
        obj = b"chat.completion.chunk" if self.chat else b"text_completion"
        base = b'data: {"id":"' + rid.encode() + b'","object":"' + obj + b'","created":' + str(created).encode()
        base += b',"model":' + m + b',"choices":[{"index":0,'
        if self.chat:
            self.head = base + b'"delta":{"content":"'
            self.tail = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
            self.role = base + b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self.head = base + b'"text":"'
            self.tail = b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            self.role = b""

    def last_tail(self, reason: str) -> bytes:
        r = reason.encode()
        if self.chat:
            return b'"},"logprobs":null,"finish_reason":"' + r + b'","stop_reason":null}]}\n\n'
        return b'","logprobs":null,"finish_reason":"' + r + b'","stop_reason":null}]}\n\n'

    def usage_chunk(self, prompt: int, completion: int, cached: int | None = None) -> bytes:
        """The usage-only chunk (vLLM dumps it with exclude_none: no `prompt_tokens_details` key when null)."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        use = usage(prompt, completion, cached)
        if use["prompt_tokens_details"] is None:
            del use["prompt_tokens_details"]
        return b"data: " + orjson.dumps({"id": self.id, "object": obj, "created": self.created,
                                         "model": self.model, "choices": [], "usage": use}) + b"\n\n"


def completion_body(kind: str, rid: str, created: int, model: str, text: str, reason: str,
                    use: dict[str, Any]) -> bytes:
    """A non-streaming chat.completion or text_completion response."""
    if kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": None, "annotations": None,
                        "audio": None, "function_call": None, "tool_calls": [], "reasoning_content": None},
            "logprobs": None, "finish_reason": reason, "stop_reason": None,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None,
                  "prompt_logprobs": None}
        obj = "text_completion"
    body: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
                            "service_tier": None, "system_fingerprint": None, "usage": use}
    if kind == "chat":  # ChatCompletionResponse has it; CompletionResponse only per choice
        body["prompt_logprobs"] = None
    body["kv_transfer_params"] = None
    return orjson.dumps(body)


def embeddings_body(model: str, n_inputs: int, prompt_tokens: int, created: int, dim: int = 16) -> bytes:
    data = [{"index": i, "object": "embedding",
             "embedding": [round(((i * 31 + j * 7) % 97) / 97.0 - 0.5, 4) for j in range(dim)]}
            for i in range(n_inputs)]
    return orjson.dumps({"id": f"embd-{os.urandom(16).hex()}", "object": "list", "created": created, "model": model,
                         "data": data, "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens,
                                                 "completion_tokens": 0, "prompt_tokens_details": None}})


def models_body(model: str, max_len: int, created: int) -> bytes:
    return orjson.dumps({"object": "list", "data": [{
        "id": model, "object": "model", "created": created, "owned_by": "vllm", "root": model, "parent": None,
        "max_model_len": max_len,
        "permission": [{"id": f"modelperm-{model}", "object": "model_permission", "created": created,
                        "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                        "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                        "organization": "*", "group": None, "is_blocking": False}],
    }]})
