"""Response bodies as real OpenAI-compatible servers send them (vLLM, SGLang, TGI, llama.cpp).

Shapes follow each server's documented/observed output: field order, spacing (`data:` without a
space in TGI, `": "` separators and CRLF event ends in llama-cpp-python's sse-starlette), role-only
first chunks, usage-only chunks, error events. Each entry: (name, body, expected facts).
"""

from __future__ import annotations

import orjson


def sse(*payloads: object, sep: bytes = b"\n", space: bool = True, json_sep: bool = False) -> bytes:
    out = []
    prefix = b"data: " if space else b"data:"
    for p in payloads:
        if isinstance(p, bytes):
            data = p
        elif json_sep:
            import json

            data = json.dumps(p).encode()  # ", " and ": " separators like Python's json
        else:
            data = orjson.dumps(p)
        out.append(prefix + data + sep + sep)
    return b"".join(out)


def _chat(content: str | None = None, role: str | None = None, finish: str | None = None, **delta_extra):
    delta: dict = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    delta.update(delta_extra)
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": None,
    }


def _usage_only(prompt: int, completion: int, cached: int | None = None) -> dict:
    usage: dict = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": usage}


VLLM_CHAT_USAGE = sse(
    _chat("", role="assistant"),
    _chat("Hello"),
    _chat(" world"),
    _chat("!", finish="length"),
    _usage_only(12, 3, cached=0),
    b"[DONE]",
)

VLLM_COMPLETIONS = sse(
    *[
        {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
         "choices": [{"index": 0, "text": t, "logprobs": None, "finish_reason": f, "stop_reason": None}], "usage": None}
        for t, f in ((" a", None), (" b", None), (" c", None), (" d", "length"))
    ],
    b"[DONE]",
)

SGLANG_REASONING = sse(
    _chat(None, role="assistant", reasoning_content="think", tool_calls=None),
    _chat(None, reasoning_content=" more", tool_calls=None),
    _chat("Answer", reasoning_content=None, tool_calls=None),
    _chat("", finish="stop", reasoning_content=None, tool_calls=None),
    b"[DONE]",
)

TGI_CHAT = sse(
    *[_chat(t, role="assistant") for t in ("Hi", " there", ",", " friend")][:-1],
    {**_chat(" friend", role="assistant", finish="length"),
     "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}},
    b"[DONE]",
    space=False,
)

LLAMA_CPP_PYTHON = sse(
    {"id": "chatcmpl-x", "model": "m", "created": 1, "object": "chat.completion.chunk",
     "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}]},
    *[{"id": "chatcmpl-x", "model": "m", "created": 1, "object": "chat.completion.chunk",
       "choices": [{"index": 0, "delta": {"content": t}, "logprobs": None, "finish_reason": None}]}
      for t in ("The", " sky", " is", " blue", ".")],
    {"id": "chatcmpl-x", "model": "m", "created": 1, "object": "chat.completion.chunk",
     "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}]},
    b"[DONE]",
    sep=b"\r\n",
    json_sep=True,
)

TOOL_CALLS = sse(
    _chat(None, role="assistant"),
    _chat(None, tool_calls=[{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]),
    _chat(None, tool_calls=[{"index": 0, "function": {"arguments": "{\"x\": 1}"}}]),
    _chat(None, finish="tool_calls", tool_calls=[]),
    b"[DONE]",
)

ERROR_MID_STREAM = sse(
    _chat("", role="assistant"),
    _chat("one"),
    {"error": {"object": "error", "message": "engine died", "type": "InternalServerError", "param": None, "code": 500}},
    b"[DONE]",
)

# Tricky text: generated content that itself looks like SSE/JSON keys must not be counted twice.
TRICKY_TEXT = (
    sse(_chat("", role="assistant"), _chat('"content":"x"\n\ndata: [DONE]\n\n'), _chat("ok", finish="stop"))
    + b": keep-alive comment\n\n"
    + sse(b"[DONE]")
)

MULTILINE = (
    b": ping\n\n"
    b'data: {"choices":[{"index":0,\ndata: "delta":{"content":"A"},"finish_reason":null}]}\n\n'
    b"event: message\n"
    b'data: {"choices":[{"index":0,"delta":{"content":"B"},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)

# name, body, (output_chunks, output_tokens, tokens_source, finish_reason, error)
SHAPES = [
    ("vllm_chat_usage", VLLM_CHAT_USAGE, (3, 3, "usage", "length", None)),
    ("vllm_completions", VLLM_COMPLETIONS, (4, 4, "chunks", "length", None)),
    ("sglang_reasoning", SGLANG_REASONING, (3, 3, "chunks", "stop", None)),
    ("tgi_chat", TGI_CHAT, (4, 4, "usage", "length", None)),
    ("llama_cpp_python", LLAMA_CPP_PYTHON, (5, 5, "chunks", "length", None)),
    ("tool_calls", TOOL_CALLS, (2, 2, "chunks", "tool_calls", None)),
    ("error_mid_stream", ERROR_MID_STREAM, (1, 1, "chunks", "error", "stream_error_event")),
    ("tricky_text", TRICKY_TEXT, (2, 2, "chunks", "stop", None)),
    ("multiline", MULTILINE, (2, 2, "chunks", "stop", None)),
]
