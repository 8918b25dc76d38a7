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

from slogate.traces.metrics import itl_summary, tpot
from slogate.traces.record import ErrorClass, RequestRecord, TokensSource

NS = 1e-9

# One SSE event ends at a blank line; line ends are LF, CRLF or a lone CR (the slow path: with no
# CR in the buffer events are split with bytes.find, which is several times cheaper than a regex).
_EVENT_END = re.compile(rb"(?:\r\n|\n|\r(?!\n))(?:\r\n|\n|\r(?!\n))")
_LINE_END = re.compile(rb"\r\n|\n|\r")
# A chunk carries generated output when one of these keys holds a non-empty string (or, for
# tool_calls, a non-empty list). Quotes inside JSON strings are escaped, so a key pattern cannot
# match inside generated text; bytes.find on these literals is far cheaper than a regex search.
_OUTPUT_KEYS = (b'"content"', b'"text"', b'"reasoning_content"', b'"reasoning"')
_OUTPUT_KEYS_TEXT_FIRST = (b'"text"', b'"content"', b'"reasoning_content"', b'"reasoning"')
_TOOL_CALLS = b'"tool_calls"'
_FINISH_KEY = b'"finish_reason"'
_USAGE_KEY = b'"usage"'
_ERROR_WORD = b'"error"'  # as a key, or as the value of "object": either way the event is decoded
_SPACE = frozenset(b" \t\r\n")
# One scan for "does this event need decoding": an "error" word, a string finish_reason or a usage
# object (the same test as `_ERROR_WORD in p or _value_at(p, _FINISH_KEY, '"') or _value_at(p, _USAGE_KEY, '{')`).
_TAIL_GATE = re.compile(rb'"error"|"finish_reason"[ \t\r\n]*:[ \t\r\n]*"|"usage"[ \t\r\n]*:[ \t\r\n]*\{').search
_MODEL_KEY = b'"model"'
MAX_MODEL_BYTES = 256  # a longer "model" value is not a model name: not read
_DONE = b"[DONE]"
_NON_STREAM_BODY_LIMIT = 16 << 20  # bytes kept to read usage from a non-streaming body
MAX_EVENT_BYTES = 1 << 20  # a longer SSE event is relayed unparsed (counted in `oversized_events`)


class StreamObserver:
    """Feed with `feed(piece, t_ns)`, end with `finish(t_ns, status=...)`.

    With `strip_usage=True` (the gateway injected `stream_options.include_usage` on the client's
    behalf) `feed` returns the bytes to forward: whole events only, minus the usage-only chunk.
    Otherwise `feed` returns the piece unchanged.
    """

    __slots__ = (
        "_body",
        "_body_len",
        "_buf",
        "_cached_tokens",
        "_chunk_ns",
        "_done",
        "_error",
        "_finish_reason",
        "_first_ns",
        "_first_output_ns",
        "_gaps_ns",
        "_held",
        "_held_len",
        "_keep_chunk_times",
        "_last_ns",
        "_last_output_ns",
        "_output_chunks",
        "_output_keys",
        "_response_model",
        "_skip_tail",
        "_skipping",
        "_strip_usage",
        "_usage_completion",
        "_usage_prompt",
        "_want_model",
        "after_done_bytes",
        "endpoint",
        "max_event_bytes",
        "n_inputs",
        "oversized_events",
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
        max_event_bytes: int = MAX_EVENT_BYTES,
    ) -> None:
        self.t0_ns = t0_ns
        self.stream = stream
        self.endpoint = endpoint
        self.n_inputs = n_inputs
        self._strip_usage = strip_usage and stream
        self._keep_chunk_times = keep_chunk_times
        self._buf = b""
        # An incomplete event longer than one piece: the pieces after `_buf`, joined once when the
        # event ends (never re-copied or re-scanned per piece); past `max_event_bytes` it is skipped.
        self._held: list[bytes] = []
        self._held_len = 0
        self._skipping = False
        self._skip_tail = b""
        self.max_event_bytes = max_event_bytes
        self.oversized_events = 0
        self._body: list[bytes] = []
        self._body_len = 0
        self._first_ns: int | None = None
        self._first_output_ns: int | None = None
        self._last_output_ns = 0
        self._last_ns = t0_ns
        self._gaps_ns: list[int] = []
        self._chunk_ns: list[int] | None = [] if keep_chunk_times else None
        self._output_chunks = 0
        # Same keys either way; the likely one first saves a scan per event.
        self._output_keys = _OUTPUT_KEYS if "chat" in endpoint else _OUTPUT_KEYS_TEXT_FIRST
        self._done = False
        self.after_done_bytes = 0
        self._finish_reason: str | None = None
        self._error: ErrorClass | None = None
        self._usage_prompt: int | None = None
        self._usage_completion: int | None = None
        self._cached_tokens: int | None = None
        # The upstream's "model" (gen_ai.response.model): read from the first data event of a
        # stream by one bytes.find (no JSON decode), from the decoded body otherwise.
        self._response_model: str | None = None
        self._want_model = stream

    # ------------------------------------------------------------------ feeding
    def feed(self, piece: bytes, t_ns: int) -> bytes:
        """Observe one piece of the body as it arrived at `t_ns`; return the bytes to forward."""
        if self._first_ns is None:
            self._first_ns = t_ns
        self._last_ns = t_ns
        if not self.stream:
            if self._body_len < _NON_STREAM_BODY_LIMIT:
                self._body.append(piece)
                self._body_len += len(piece)
            return piece
        if self._done:  # nothing after [DONE] is observed or forwarded; only counted
            self.after_done_bytes += len(piece)
            return b""
        if self._skipping:
            return self._skip(piece, t_ns)
        if self._buf:
            edge = (self._held[-1] if self._held else self._buf)[-3:]
            if not _has_event_end(edge + piece):  # the event goes on: hold the piece, scan nothing again
                self._held.append(piece)
                self._held_len += len(piece)
                if len(self._buf) + self._held_len > self.max_event_bytes:
                    return self._oversized(piece, t_ns)
                return b"" if self._strip_usage else piece
            if self._held:
                self._buf = b"".join([self._buf, *self._held])
                self._held, self._held_len = [], 0
        if not self._buf and piece.find(b"\n") == len(piece) - 2 and piece[-1:] == b"\n" and b"\r" not in piece:
            # fast path: the piece is exactly one single-line LF-terminated event (the usual case)
            if piece.startswith(b"data:"):
                keep = self._payload(piece[6:-2] if piece[5:6] == b" " else piece[5:-2], t_ns, False)
            else:
                keep = self._event(piece[:-2], t_ns)
            return piece if (keep or not self._strip_usage) else b""
        buf = self._buf + piece if self._buf else piece
        if b"\r" not in buf:
            return self._feed_lf(piece, buf, t_ns)
        start = 0
        out: list[bytes] | None = [] if self._strip_usage else None
        end_cr = buf.endswith(b"\r")
        for m in _EVENT_END.finditer(buf):
            if end_cr and m.end() == len(buf):
                break  # a CR at the end may be the first half of CRLF: wait for the next byte
            keep = self._event(buf[start : m.start()], t_ns)
            if out is not None and keep:
                out.append(buf[start : m.end()])
            start = m.end()
            if self._done:
                return self._cut_at_done(piece, buf, start, out)
        self._buf = buf[start:]
        if out is None:
            return piece
        return b"".join(out)

    def _cut_at_done(self, piece: bytes, buf: bytes, start: int, out: list[bytes] | None) -> bytes:
        """[DONE] ended at `start` of `buf` (= held bytes + `piece`): forward up to there, count the rest."""
        rest = len(buf) - start
        self.after_done_bytes += rest
        self._buf = b""
        if out is None:
            return piece[: len(piece) - rest]
        return b"".join(out)

    def _feed_lf(self, piece: bytes, buf: bytes, t_ns: int) -> bytes:
        """Events split at LF LF (no CR anywhere in `buf`); forwards contiguous runs of kept events."""
        start = 0
        kept_from = 0  # strip mode: start of the run of kept events not yet copied out
        out: list[bytes] | None = None
        payload_of = self._payload
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            if buf[nl + 1 : nl + 2] == b"\n":  # a single-line event: the common shape
                end = nl
                if buf.startswith(b"data: ", start):
                    keep = payload_of(buf[start + 6 : end], t_ns, False)
                elif buf.startswith(b"data:", start):
                    keep = payload_of(buf[start + 5 : end], t_ns, False)
                else:
                    keep = self._event(buf[start:end], t_ns)
            else:
                end = buf.find(b"\n\n", nl)
                if end < 0:
                    break
                keep = self._event(buf[start:end], t_ns)
            if not keep and self._strip_usage:
                if out is None:
                    out = []
                out.append(buf[kept_from:start])
                kept_from = end + 2
            start = end + 2
            if self._done:
                if self._strip_usage:
                    (out if out is not None else (out := [])).append(buf[kept_from:start])
                return self._cut_at_done(piece, buf, start, out)
        self._buf = buf[start:] if start < len(buf) else b""
        if not self._strip_usage:
            return piece
        if out is None:
            return buf if start == len(buf) else buf[:start]
        out.append(buf[kept_from:start])
        return b"".join(out)

    def _oversized(self, piece: bytes, t_ns: int) -> bytes:
        """The incomplete event outgrew `max_event_bytes`: release what was held, skip to its end."""
        held = b"".join([self._buf, *self._held]) if self._strip_usage else b""
        self._skip_tail = (self._held[-1] if self._held else self._buf)[-3:]
        self._buf, self._held, self._held_len = b"", [], 0
        self._skipping = True
        self.oversized_events += 1
        self._output(t_ns)  # unparsed, but an event this long is generated output
        return held if self._strip_usage else piece

    def _skip(self, piece: bytes, t_ns: int) -> bytes:
        """Relay an oversized event unparsed until its blank line; then observe as usual."""
        probe = self._skip_tail + piece
        if b"\r" in probe:
            m = _EVENT_END.search(probe)
            end = -1 if m is None else m.end()
        else:
            end = probe.find(b"\n\n")
            end = -1 if end < 0 else end + 2
        if end < 0:
            self._skip_tail = probe[-3:]
            return piece
        self._skipping, self._skip_tail = False, b""
        cut = max(0, end - (len(probe) - len(piece)))
        rest = self.feed(piece[cut:], t_ns) if cut < len(piece) else b""
        return piece[:cut] + rest if self._strip_usage else piece

    def flush(self) -> bytes:
        """At end of body: the held-back incomplete event (strip mode), observed and returned."""
        if self._held:
            self._buf = b"".join([self._buf, *self._held])
            self._held, self._held_len = [], 0
        if self._skipping:
            self._skipping, self._buf = False, b""
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
            return self._payload(event[6:] if event[5:6] == b" " else event[5:], t_ns, False)
        payload, named_error = _parse_event(event)
        if payload is None:
            return True  # comment / keep-alive / empty
        return self._payload(payload, t_ns, named_error)

    def _payload(self, payload: bytes, t_ns: int, named_error: bool) -> bool:
        """Observe the data of one event; return False when it must not be forwarded (injected usage)."""
        if payload == _DONE:
            self._done = True
            return True
        if self._want_model:  # the first data event only
            self._want_model = False
            self._response_model = _model_of(payload)
        if _has_output(payload, self._output_keys):
            self._output(t_ns)
        if named_error or _TAIL_GATE(payload) is not None:
            error_word = _ERROR_WORD in payload
            if named_error or (error_word and self._error_event(payload)):
                self._error = self._error or "stream_error_event"
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

    @property
    def done(self) -> bool:
        """`data: [DONE]` went by: the stream is complete for the client."""
        return self._done

    # ---------------------------------------------------------------- finishing
    def finish(self, t_ns: int, *, status: int, error: ErrorClass | None = None) -> RequestRecord:
        """Close the observation at the last byte (`t_ns`) and build the record's measured fields.

        The caller fills in context (`t`, model, upstream, max_tokens, hash_ids, ...).
        """
        if self.stream and self._buf:
            self.flush()
        if not self.stream and self._body and 200 <= status < 300:
            self._read_json_body(b"".join(self._body))
        if error is None:
            error = self._error
        ok = 200 <= status < 300
        if error is None and not ok:
            error = "upstream_status"
        if error is None and self.stream and not self._done and self._finish_reason is None:
            error = "incomplete_stream"
        if error is None and self._finish_reason in ("error", "abort"):
            error = "aborted"

        ttft = (self._first_output_ns - self.t0_ns) * NS if (self.stream and self._first_output_ns is not None) else None
        e2e = (t_ns - self.t0_ns) * NS
        output_tokens: int | None
        source: TokensSource
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
            response_model=self._response_model,
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
        model = obj.get("model")
        if isinstance(model, str) and 0 < len(model) <= MAX_MODEL_BYTES:
            self._response_model = model
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
    def got_bytes(self) -> bool:
        """Some body byte arrived (a timeout before that is a first-byte timeout)."""
        return self._first_ns is not None

    @property
    def output_chunks(self) -> int:
        """Output-bearing chunks seen so far (a live token count for routing)."""
        return self._output_chunks


def _has_event_end(data: bytes) -> bool:
    """Whether `data` holds a blank line (an SSE event end) in any line-end style."""
    if b"\r" not in data:
        return b"\n\n" in data
    return _EVENT_END.search(data) is not None


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
    if i < 0:
        return False
    n = len(payload)
    k = len(key)
    while i >= 0:
        j = i + k
        if j + 1 < n and payload[j] == 58 and payload[j + 1] not in _SPACE:  # compact `"key":v`
            if payload[j + 1] == first:
                return True
        else:
            j = _value_start(payload, j)
            if 0 <= j < n and payload[j] == first:
                return True
        i = payload.find(key, i + 1)
    return False


def _model_of(payload: bytes) -> str | None:
    """The string value of the top-level-looking `"model"` key of one chunk, found with bytes.find
    (a key cannot occur inside a JSON string: its quotes would be escaped). None when absent, not a
    string, longer than MAX_MODEL_BYTES, or not valid UTF-8; escapes are decoded by orjson."""
    i = payload.find(_MODEL_KEY)
    if i < 0:
        return None
    j = _value_start(payload, i + len(_MODEL_KEY))
    if j < 0 or j >= len(payload) or payload[j] != 34:  # '"'
        return None
    end = payload.find(b'"', j + 1, j + 2 + MAX_MODEL_BYTES)
    while end > 0 and payload[end - 1] == 92:  # '\\': an escaped quote (rare): find the real end
        k = end - 1
        while k > j and payload[k] == 92:
            k -= 1
        if (end - 1 - k) % 2 == 0:
            break
        end = payload.find(b'"', end + 1, j + 2 + MAX_MODEL_BYTES)
    if end < 0 or end == j + 1:
        return None
    raw = payload[j : end + 1]
    if b"\\" not in raw:
        try:
            return raw[1:-1].decode()
        except UnicodeDecodeError:
            return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, str) and value else None


def _has_output(payload: bytes, keys: tuple[bytes, ...] = _OUTPUT_KEYS) -> bool:
    """Does this chunk carry generated output (a non-empty text field or a tool call)?"""
    n = len(payload)
    for key in keys:
        i = payload.find(key)
        while i >= 0:
            j = i + len(key)
            if j + 2 < n and payload[j] == 58 and payload[j + 1] == 34:  # compact `"key":"`
                if payload[j + 2] != 34:
                    return True
            else:
                j = _value_start(payload, j)
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
