"""Times one HTTP response of an OpenAI-compatible server from its raw bytes.

`StreamObserver` is fed the response body piece by piece with a monotonic timestamp per piece
and produces TTFB, TTFT, ITL gaps, E2E, token counts, finish reason and error class (README
"Metric definitions"). The gateway and the replay client both use it, so their numbers mean the
same. Hot path: it scans bytes for SSE event boundaries and decodes JSON only for the few events
that need it (finish, usage, error); it never keeps prompt or completion text.
"""

from __future__ import annotations

import re

import orjson

from traces.metrics import itl_summary, tpot
from traces.record import RequestRecord

NS = 1e-9

# One SSE event ends at a blank line; line ends are LF, CRLF or a lone CR (the slow path: with no
# CR in the buffer events are split with bytes.find, which is several times cheaper than a regex).
_EVENT_END = re.compile(rb"(?:\r\n|\n|\r(?!\n))(?:\r\n|\n|\r(?!\n))")
_LINE_END = re.compile(rb"\r\n|\n|\r")
# A chunk carries generated output when one of these keys holds a non-empty string (or, for
# tool_calls, a non-empty list). Quotes inside JSON strings are escaped, so a key pattern cannot
# match inside generated text; bytes.find on these literals is far cheaper than a regex search.
_OUTPUT_KEYS = (b'"content"', b'"text"', b'"reasoning_content"', b'"reasoning"')
_TOOL_CALLS = b'"tool_calls"'
_FINISH_KEY = b'"finish_reason"'
_USAGE_KEY = b'"usage"'
_ERROR_WORD = b'"error"'  # as a key, or as the value of "object": either way the event is decoded
_SPACE = frozenset(b" \t\r\n")
_DONE = b"[DONE]"
_NON_STREAM_BODY_LIMIT = 16 << 20  # bytes kept to read usage from a non-streaming body


class StreamObserver:
    """Feed with `feed(piece, t_ns)`, end with `finish(t_ns, status=...)`.

    With `strip_usage=True` (the gateway injected `stream_options.include_usage` on the client's
    behalf) `feed` returns the bytes to forward: whole events only, minus the usage-only chunk.
    Otherwise `feed` returns the piece unchanged.
    """

    __slots__ = (
        "_body",
        "_buf",
        "_cached_tokens",
        "_chunk_ns",
        "_done",
        "_error",
        "_finish_reason",
        "_first_ns",
        "_first_output_ns",
        "_gaps_ns",
        "_keep_chunk_times",
        "_last_ns",
        "_last_output_ns",
        "_output_chunks",
        "_strip_usage",
        "_usage_completion",
        "_usage_prompt",
        "endpoint",
        "n_inputs",
        "stream",
        "t0_ns",
    )

    def __init__(
        self,
        t0_ns: int,
        *,
        stream: bool,
        endpoint: str = "/v1/chat/completions",
        strip_usage: bool = False,
        keep_chunk_times: bool = False,
        n_inputs: int | None = None,
    ) -> None:
        self.t0_ns = t0_ns
        self.stream = stream
        self.endpoint = endpoint
        self.n_inputs = n_inputs
        self._strip_usage = strip_usage and stream
        self._keep_chunk_times = keep_chunk_times
        self._buf = b""
        self._body: list[bytes] = []
        self._first_ns: int | None = None
        self._first_output_ns: int | None = None
        self._last_output_ns = 0
        self._last_ns = t0_ns
        self._gaps_ns: list[int] = []
        self._chunk_ns: list[int] | None = [] if keep_chunk_times else None
        self._output_chunks = 0
        self._done = False
        self._finish_reason: str | None = None
        self._error: str | None = None
        self._usage_prompt: int | None = None
        self._usage_completion: int | None = None
        self._cached_tokens: int | None = None

    # ------------------------------------------------------------------ feeding
    def feed(self, piece: bytes, t_ns: int) -> bytes:
        """Observe one piece of the body as it arrived at `t_ns`; return the bytes to forward."""
        if self._first_ns is None:
            self._first_ns = t_ns
        self._last_ns = t_ns
        if not self.stream:
            if sum(map(len, self._body)) < _NON_STREAM_BODY_LIMIT:
                self._body.append(piece)
            return piece
        if not self._buf and piece.endswith(b"\n\n") and piece.find(b"\n\n") == len(piece) - 2 and b"\r" not in piece:
            # fast path: the piece is exactly one LF-terminated event (the usual case)
            keep = self._event(piece[:-2], t_ns)
            return piece if (keep or not self._strip_usage) else b""
        buf = self._buf + piece if self._buf else piece
        start = 0
        out: list[bytes] | None = [] if self._strip_usage else None
        if b"\r" not in buf:
            end = buf.find(b"\n\n")
            while end >= 0:
                keep = self._event(buf[start:end], t_ns)
                if out is not None and keep:
                    out.append(buf[start : end + 2])
                start = end + 2
                end = buf.find(b"\n\n", start)
        else:
            end_cr = buf.endswith(b"\r")
            for m in _EVENT_END.finditer(buf):
                if end_cr and m.end() == len(buf):
                    break  # a CR at the end may be the first half of CRLF: wait for the next byte
                keep = self._event(buf[start : m.start()], t_ns)
                if out is not None and keep:
                    out.append(buf[start : m.end()])
                start = m.end()
        self._buf = buf[start:]
        if out is None:
            return piece
        return b"".join(out)

    def flush(self) -> bytes:
        """At end of body: the held-back incomplete event (strip mode), observed and returned."""
        tail, self._buf = self._buf, b""
        if not tail or not self.stream:
            return b""
        if tail.strip():
            keep = self._event(tail, self._last_ns)
            return tail if (self._strip_usage and keep) else b""
        return tail if self._strip_usage else b""

    def _event(self, event: bytes, t_ns: int) -> bool:
        """Observe one SSE event; return False when it must not be forwarded (injected usage)."""
        if event.startswith(b"data:") and b"\n" not in event and b"\r" not in event:
            payload = event[6:] if event[5:6] == b" " else event[5:]
            named_error = False
        else:
            payload, named_error = _parse_event(event)
            if payload is None:
                return True  # comment / keep-alive / empty
        if payload == _DONE:
            self._done = True
            return True
        if _has_output(payload):
            self._output(t_ns)
        error_word = _ERROR_WORD in payload
        if named_error or error_word or _value_at(payload, _FINISH_KEY, 34) or _value_at(payload, _USAGE_KEY, 123):
            if named_error or (error_word and self._error_event(payload)):
                self._error = self._error or "stream_error"
                self._finish_reason = self._finish_reason or "error"
                return True
            return self._decode_tail_chunk(payload)
        return True

    def _output(self, t_ns: int) -> None:
        if self._first_output_ns is None:
            self._first_output_ns = t_ns
        else:
            self._gaps_ns.append(t_ns - self._last_output_ns)
        self._last_output_ns = t_ns
        self._output_chunks += 1
        if self._chunk_ns is not None:
            self._chunk_ns.append(t_ns)

    def _error_event(self, payload: bytes) -> bool:
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return False
        return isinstance(obj, dict) and ("error" in obj or obj.get("object") == "error")

    def _decode_tail_chunk(self, payload: bytes) -> bool:
        """A chunk with finish_reason and/or usage: read them. False for an injected usage-only chunk."""
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return True
        if not isinstance(obj, dict):
            return True
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and choice.get("finish_reason"):
                    self._finish_reason = str(choice["finish_reason"])
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._read_usage(usage)
            if self._strip_usage and choices == []:
                return False
        return True

    def _read_usage(self, usage: dict) -> None:
        prompt = usage.get("prompt_tokens")
        completion = usage.get("completion_tokens")
        if isinstance(prompt, int):
            self._usage_prompt = prompt
        if isinstance(completion, int):
            self._usage_completion = completion
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            self._cached_tokens = details["cached_tokens"]

    # ---------------------------------------------------------------- finishing
    def finish(self, t_ns: int, *, status: int, error: str | None = None) -> RequestRecord:
        """Close the observation at the last byte (`t_ns`) and build the record's measured fields.

        The caller fills in context (`t`, model, upstream, max_tokens, hash_ids, ...).
        """
        if self.stream and self._buf:
            self.flush()
        if not self.stream and self._body and 200 <= status < 300:
            self._read_json_body(b"".join(self._body))
        if error is None:
            error = self._error
        if error is None and not (200 <= status < 300):
            error = f"http_{status // 100}xx"
        if error is None and self.stream and 200 <= status < 300 and not self._done and self._finish_reason is None:
            error = "incomplete_stream"

        ttft = (self._first_output_ns - self.t0_ns) * NS if (self.stream and self._first_output_ns is not None) else None
        e2e = (t_ns - self.t0_ns) * NS
        output_tokens: int | None
        if self._usage_completion is not None:
            output_tokens, source = self._usage_completion, "usage"
        elif self.stream:
            output_tokens, source = self._output_chunks, "chunks"
        elif self.endpoint.endswith("embeddings"):
            output_tokens, source = None, "usage"
        else:
            output_tokens, source = self._output_chunks, "estimate"
        record = RequestRecord(
            t=0.0,
            endpoint=self.endpoint,
            stream=self.stream,
            input_tokens=self._usage_prompt,
            output_tokens=output_tokens,
            tokens_source=source,
            ttft=ttft,
            tpot=tpot(e2e, ttft, output_tokens),
            e2e=e2e,
            ttfb=(self._first_ns - self.t0_ns) * NS if self._first_ns is not None else None,
            itl=itl_summary([g * NS for g in self._gaps_ns]) if self._gaps_ns else None,
            status=status,
            finish_reason=self._finish_reason,
            error=error,
            cached_tokens=self._cached_tokens,
            n_inputs=self.n_inputs,
        )
        if self._chunk_ns is not None:
            record.chunk_times = [(c - self.t0_ns) * NS for c in self._chunk_ns]
        return record

    def _read_json_body(self, body: bytes) -> None:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        if not isinstance(obj, dict):
            return
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._read_usage(usage)
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            reason = choices[0].get("finish_reason")
            self._finish_reason = str(reason) if reason else None
            if self._usage_completion is None:
                self._estimate_output(choices)
        if self.n_inputs is None and isinstance(obj.get("data"), list):
            self.n_inputs = len(obj["data"])

    def _estimate_output(self, choices: list) -> None:
        """No usage in a non-streaming body: ~4 characters per token (tokens_source 'estimate')."""
        chars = 0
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            text = choice.get("text")
            if text is None and isinstance(choice.get("message"), dict):
                text = choice["message"].get("content")
            if isinstance(text, str):
                chars += len(text)
        self._output_chunks = max(1, round(chars / 4)) if chars else 0

    @property
    def output_chunks(self) -> int:
        """Output-bearing chunks seen so far (a live token count for routing)."""
        return self._output_chunks

    @property
    def first_output_ns(self) -> int | None:
        return self._first_output_ns


def _parse_event(event: bytes) -> tuple[bytes | None, bool]:
    """Slow path for multi-line events: joined `data:` lines and whether the event is named error."""
    data: list[bytes] = []
    named_error = False
    for line in _LINE_END.split(event):
        if not line or line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event" and value.strip() == b"error":
            named_error = True
    if not data:
        return None, named_error
    return b"\n".join(data), named_error


def _value_start(payload: bytes, i: int) -> int:
    """Index of the value after a JSON key ending at `i` (skipping `:` and blanks); -1 if no colon."""
    n = len(payload)
    while i < n and payload[i] in _SPACE:
        i += 1
    if i >= n or payload[i] != 58:  # ':'
        return -1
    i += 1
    while i < n and payload[i] in _SPACE:
        i += 1
    return i


def _value_at(payload: bytes, key: bytes, first: int) -> bool:
    """True when some occurrence of `key` has a value starting with byte `first`."""
    i = payload.find(key)
    while i >= 0:
        j = _value_start(payload, i + len(key))
        if 0 <= j < len(payload) and payload[j] == first:
            return True
        i = payload.find(key, i + 1)
    return False


def _has_output(payload: bytes) -> bool:
    """Does this chunk carry generated output (a non-empty text field or a tool call)?"""
    n = len(payload)
    for key in _OUTPUT_KEYS:
        i = payload.find(key)
        while i >= 0:
            j = _value_start(payload, i + len(key))
            if 0 <= j < n - 1 and payload[j] == 34 and payload[j + 1] != 34:  # '"' then not '"'
                return True
            i = payload.find(key, i + 1)
    i = payload.find(_TOOL_CALLS)
    while i >= 0:
        j = _value_start(payload, i + len(_TOOL_CALLS))
        if 0 <= j < n and payload[j] == 91:  # '['
            k = j + 1
            while k < n and payload[k] in _SPACE:
                k += 1
            if k < n and payload[k] == 123:  # '{'
                return True
        i = payload.find(_TOOL_CALLS, i + 1)
    return False
