"""The simulator's HTTP face: an aiohttp app per replica speaking vLLM's OpenAI-compatible API.

Handlers parse once (orjson), validate as vLLM does, hand a `SimReq` to the replica's engine and
wait; token bytes are written by `stream.Sink` from the engine loop. Never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import msgspec
import orjson
from aiohttp import HttpVersion11, web

from slogate.replay.sim import protocol, tokenizer
from slogate.replay.sim.clock import RealClock
from slogate.replay.sim.config import EngineSpec, output_length
from slogate.replay.sim.engine import Engine
from slogate.replay.sim.faults import HEADER, FaultConfig, Leak, RequestFault, parse_request_fault
from slogate.replay.sim.gcpace import GcPacer
from slogate.replay.sim.prefix import hash_pieces
from slogate.replay.sim.prom import ServerStats, SimCollector, make_registry, render
from slogate.replay.sim.scheduler import SimReq
from slogate.replay.sim.stream import Sink

SIM_VERSION = "0.11.0+slogate-sim"
JSON = "application/json"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the text format, as vLLM's /metrics names it


class ServerOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """HTTP-side options (flags, TOML `[server]`)."""

    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    max_waiting: int | None = None  # bounded waiting queue; full → reject
    reject_status: int = 503  # 503 or 429 when the queue is full
    enable_prompt_tokens_details: bool = False  # usage.prompt_tokens_details.cached_tokens


class Request(msgspec.Struct):
    """What a handler extracted from an LLM request body."""

    kind: str
    pieces: list[str]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool


def _json_error(body: bytes, status: int, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=body, status=status, content_type=JSON, headers=headers)


def _bad(message: str, param: str | None = None) -> web.Response:
    return _json_error(protocol.error_body(message, "BadRequestError", 400, param), 400)


def _invalid(message: str) -> web.Response:
    """What vLLM's handler of FastAPI's request validation errors answers (not FastAPI's 422)."""
    return _json_error(protocol.error_body(message, "Bad Request", 400), 400)


class _BadField(ValueError):
    """A request field of the wrong type (a 400 naming it)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})


def _lax_int(body: dict[str, Any], name: str, default: int | None) -> int | None:
    """An integer field as pydantic's lax mode reads it (vLLM's request models): an int, a float without
    a fraction, or a string of one; null is the default. A boolean is refused (it is no count)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise _BadField(f"'{name}' must be an integer, got {value!r}.", name)


def _lax_bool(body: dict[str, Any], name: str) -> bool:
    """A boolean field as pydantic's lax mode reads it: a bool, 0 or 1, or "true"/"false" (and yes/no,
    on/off, t/f, y/n, 1/0); null or absent is False."""
    value = body.get(name)
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _FALSE | _TRUE:
        return value.strip().lower() in _TRUE
    raise _BadField(f"'{name}' must be a boolean, got {value!r}.", name)


class Replica:
    """One simulated server: engine, stats, fault state and the aiohttp app."""

    def __init__(self, spec: EngineSpec, opts: ServerOptions, faults: FaultConfig, index: int,
                 pacer: GcPacer | None = None) -> None:
        self.spec = spec
        self.opts = opts
        self.faults = faults
        self.index = index
        self.model_name = opts.served_model_name or spec.model.name
        self.max_len = spec.max_model_len
        self.t0 = time.perf_counter()
        self.created = int(time.time())
        scale = (lambda t: faults.slowdown_at(t - self.t0)) if faults.slowdown else None
        self.engine = Engine(spec, RealClock(pacer), replica=index, scale=scale)
        self.stats = ServerStats(spec.max_model_len)
        self.rng = random.Random(spec.config.seed * 7919 + index)
        self.fault_rng = random.Random(faults.seed * 7919 + index)
        self.inflight: set[Sink] = set()
        self._uid = 0
        kv = self.engine.kv
        sched = self.engine.sched
        collector = SimCollector(self.model_name, index, self.stats, lambda: (
            self.engine.num_running, self.engine.num_waiting, kv.usage(), sched.num_preemptions,
            kv.queries, kv.hits))
        self.registry = make_registry(collector) if pacer is None else make_registry(collector, pacer)
        self.app = web.Application(client_max_size=256 * 1024 * 1024)
        r = self.app.router
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/embeddings", self.embeddings)
        r.add_get("/v1/models", self.models)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_get("/health", self.health)
        r.add_get("/ping", self.health)  # SageMaker's health check, GET and POST as in vLLM
        r.add_post("/ping", self.health)
        r.add_get("/load", self.load)
        r.add_get("/version", self.version)
        r.add_get("/metrics", self.metrics)
        self._allowed: dict[str, str] = {}  # path -> its methods, for the 405s below
        for route in r.routes():
            path = route.resource.canonical if route.resource is not None else ""
            methods = self._allowed.get(path, "")
            self._allowed[path] = f"{methods}, {route.method}" if methods else route.method
        r.add_route("*", "/{tail:.*}", self.unrouted)  # matched last: only what no route above takes
        self.tasks: list[asyncio.Task[None]] = []
        self.closing = asyncio.Event()  # set on shutdown: hung requests and streams end

    async def unrouted(self, request: web.Request) -> web.Response:
        """A path or method the server does not serve: 404 or 405 with a JSON body, as vLLM's FastAPI
        app answers (`{"detail": "Not Found"}`), not aiohttp's plain text."""
        allowed = self._allowed.get(request.path)
        if allowed is None:
            return web.Response(body=b'{"detail":"Not Found"}', status=404, content_type=JSON)
        return web.Response(body=b'{"detail":"Method Not Allowed"}', status=405, content_type=JSON,
                            headers={"Allow": allowed})

    def start(self) -> None:
        self.tasks.append(asyncio.create_task(self.engine.run()))
        if self.faults.dead:
            self.tasks.append(asyncio.create_task(self._dead_windows()))
        if self.faults.leak_mb_per_s:  # test fault: the process's memory grows (faults.Leak)
            self.tasks.append(asyncio.create_task(Leak(self.faults.leak_mb_per_s).run()))

    async def stop(self) -> None:
        self.closing.set()
        for sink in list(self.inflight):
            sink.finish_error("The server is shutting down.", "ServiceUnavailableError", 503)
        self.engine.stopped = True
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    # -- engine-wide faults ------------------------------------------------------------------

    def _unavailable(self) -> web.Response | None:
        since = time.perf_counter() - self.t0
        if since < self.faults.slow_start_s:
            return _json_error(protocol.error_body("The server is starting (simulated slow start).",
                                                   "ServiceUnavailableError", 503), 503, {"Retry-After": "1"})
        if self.faults.dead and self.faults.dead_at(since) is not None:
            return _json_error(protocol.error_body("Engine is dead (simulated fault).", "EngineDeadError", 503),
                               503, {"Retry-After": "1"})
        return None

    async def _dead_windows(self) -> None:
        for start, end in sorted(self.faults.dead):
            await asyncio.sleep(max(0.0, self.t0 + start - time.perf_counter()))
            for sink in list(self.inflight):
                sink.finish_error("Engine is dead (simulated fault).", "EngineDeadError", 500)
            await asyncio.sleep(max(0.0, self.t0 + end - time.perf_counter()))

    # -- small endpoints ---------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        down = self._unavailable()
        return web.Response(status=503) if down is not None else web.Response(status=200)

    async def load(self, request: web.Request) -> web.Response:
        """vLLM's `/load` as with `--enable-server-load-tracking`: LLM requests in flight."""
        return web.Response(body=orjson.dumps({"server_load": len(self.inflight)}), content_type=JSON)

    async def version(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps({"version": SIM_VERSION}), content_type=JSON)

    async def models(self, request: web.Request) -> web.Response:
        return web.Response(body=protocol.models_body(self.model_name, self.max_len, self.created),
                            content_type=JSON)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=render(self.registry), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _invalid(f"Invalid JSON body: {exc}")
        if not isinstance(body, dict):
            return _invalid("The request body must be a JSON object.")
        model = body.get("model")
        if model is not None and model != self.model_name:
            return _json_error(protocol.model_not_found(str(model)), 404)
        return body

    def _prompt_pieces(self, body: dict[str, Any]) -> list[str] | web.Response:
        if "messages" in body:
            msgs = body["messages"]
            if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
                return _bad("'messages' must be a list of objects.", "messages")
            return tokenizer.chat_pieces(msgs, body.get("add_generation_prompt", True))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return tokenizer.pieces(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            bad = next((t for t in prompt if not 0 <= t < self.spec.model.vocab), None)
            if bad is not None:
                return _bad(f"Token id {bad} is out of vocabulary", "prompt")
            return [f"<{t}>" for t in prompt]
        if prompt == []:
            return _bad("The decoder prompt cannot be empty.", "prompt")
        return _bad("'prompt' must be a string, a list of one string, or a list of token ids.", "prompt")

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        ps = self._prompt_pieces(body)
        if isinstance(ps, web.Response):
            return ps
        ids = tokenizer.token_ids(ps, self.spec.model.vocab)
        return web.Response(body=orjson.dumps({"count": len(ids), "max_model_len": self.max_len, "tokens": ids,
                                               "token_strs": ps if body.get("return_token_strs") else None}),
                            content_type=JSON)

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            return _bad("'tokens' must be a list of token ids.", "tokens")
        return web.Response(body=orjson.dumps({"prompt": tokenizer.detokenize(ids, self.spec.model.vocab)}),
                            content_type=JSON)

    # -- LLM endpoints -----------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    def _fault(self, request: web.Request) -> RequestFault | web.Response | None:
        spec = request.headers.get(HEADER)
        if spec:
            try:
                return parse_request_fault(spec)
            except ValueError as exc:
                return _bad(str(exc))
        return self.faults.sample(self.fault_rng)

    async def _admission(self, request: web.Request, fault: RequestFault | None) -> web.Response | None:
        """Faults and limits decided before the engine sees the request (None: go ahead)."""
        down = self._unavailable()
        if down is not None:
            return down
        if fault is not None:
            if fault.error is not None:
                hdr = {"Retry-After": "1"} if fault.error in (429, 503) else None
                return _json_error(protocol.error_body(f"Simulated error {fault.error}.", "InternalServerError"
                                                       if fault.error >= 500 else "BadRequestError", fault.error),
                                   fault.error, hdr)
            if fault.delay_ms:
                await asyncio.sleep(fault.delay_ms / 1e3)
            if fault.hang:
                await self.closing.wait()  # until the client goes away (handler cancelled) or shutdown
                return _json_error(protocol.error_body("The server is shutting down.",
                                                       "ServiceUnavailableError", 503), 503)
        mw = self.opts.max_waiting
        if mw is not None and self.engine.num_waiting >= mw:
            self.stats.rejected += 1
            status = self.opts.reject_status
            return _json_error(protocol.error_body(
                f"The server is overloaded: {self.engine.num_waiting} requests waiting (limit {mw}).",
                "TooManyRequests" if status == 429 else "ServiceUnavailableError", status),
                status, {"Retry-After": "1"})
        return None

    def _parse(self, body: dict[str, Any], kind: str) -> Request | web.Response:
        """The fields the engine needs, read as vLLM's request model reads them (pydantic's lax mode:
        `5.0` and `"5"` are 5, `"false"` is False, `true` is not a token count) and checked as vLLM
        checks them; a bad one is a 400 naming it."""
        if (kind == "chat") != ("messages" in body):
            return _bad("'messages' is required." if kind == "chat" else "'prompt' is required.",
                        "messages" if kind == "chat" else "prompt")
        ps = self._prompt_pieces(body)
        if isinstance(ps, web.Response):
            return ps
        if not ps:  # "" (the built-in tokenizer adds no BOS token)
            return _bad("The decoder prompt cannot be empty.", "prompt")
        try:
            n = _lax_int(body, "n", 1) or 0  # (never None: the default is 1)
            mt = _lax_int(body, "max_completion_tokens", None) if kind == "chat" else None
            if mt is None:  # completions: 16 when absent, what is left of the context when null (as vLLM)
                mt = _lax_int(body, "max_tokens", None if kind == "chat" or "max_tokens" in body else 16)
            min_tokens = _lax_int(body, "min_tokens", 0) or 0
            stream = _lax_bool(body, "stream")
            ignore_eos = _lax_bool(body, "ignore_eos")
            so = body.get("stream_options")
            # vLLM's StreamOptions.include_usage defaults to true: `"stream_options": {}` asks for usage
            include_usage = isinstance(so, dict) and ("include_usage" not in so or _lax_bool(so, "include_usage"))
        except _BadField as bad:
            return _bad(str(bad), bad.param)
        if n < 1:
            return _bad(f"n must be at least 1, got {n}.", "n")
        if n != 1:
            return _bad("The simulator supports n=1 only.", "n")
        if mt is not None and mt < 1:
            return _bad(f"max_tokens must be at least 1, got {mt}.", "max_tokens")
        if min_tokens < 0:
            return _bad(f"min_tokens must be greater than or equal to 0, got {min_tokens}.", "min_tokens")
        if mt is not None and min_tokens > mt:
            return _bad(f"min_tokens must be less than or equal to max_tokens={mt}, got {min_tokens}.", "min_tokens")
        if so is not None and not stream:
            return _bad("Stream options can only be defined when `stream=True`.", "stream_options")
        return Request(kind=kind, pieces=ps, stream=stream, include_usage=include_usage,
                       max_tokens=mt, min_tokens=min_tokens, ignore_eos=ignore_eos)

    def _length(self, r: Request, n_prompt: int) -> tuple[int, str]:
        cap = r.max_tokens if r.max_tokens is not None else self.max_len - n_prompt
        if r.ignore_eos:
            return cap, "length"
        n = max(output_length(self.rng, self.spec.config.output_median_tokens, 1 << 30), r.min_tokens)
        return (cap, "length") if n >= cap else (n, "stop")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        r = self._parse(body, kind)
        if isinstance(r, web.Response):
            return r
        n_prompt = len(r.pieces)
        if n_prompt > self.max_len or (r.max_tokens is None and n_prompt >= self.max_len):
            return _json_error(protocol.prompt_too_long(self.max_len, n_prompt), 400)
        if r.max_tokens is not None and n_prompt + r.max_tokens > self.max_len:
            return _json_error(protocol.max_tokens_too_large(r.max_tokens, self.max_len, n_prompt), 400)
        n_out, reason = self._length(r, n_prompt)
        if not self.engine.capacity_ok(n_prompt, n_out):
            return _bad(f"The request needs {n_prompt + n_out} tokens of KV cache; the simulated cache holds "
                        f"{self.engine.kv.num_blocks * self.engine.kv.block_size}.")
        fault = self._fault(request)
        if isinstance(fault, web.Response):
            return fault
        refused = await self._admission(request, fault)
        if refused is not None:
            return refused
        codec = protocol.ChunkCodec(kind, protocol.new_id(kind), int(time.time()), self.model_name)
        sink = Sink(kind=kind, codec=codec, n=n_out, reason=reason, prompt_tokens=n_prompt, stats=self.stats,
                    fault=fault, include_usage=r.include_usage, word0=self.rng.randrange(len(tokenizer.WORDS)),
                    abort=self.engine.abort, report_cached=self.opts.enable_prompt_tokens_details,
                    max_tokens=r.max_tokens if r.max_tokens is not None else self.max_len - n_prompt)
        sink.conn = request.transport
        resp: web.StreamResponse | None = None
        if r.stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                               "Cache-Control": "no-cache"})
            if request.version >= HttpVersion11:
                resp.enable_chunked_encoding()
            else:  # HTTP/1.0 has no chunked encoding: the stream ends when the connection closes,
                sink.chunked = False  # also for a client that asked to keep it alive
                resp.force_close()
            await resp.prepare(request)
            sink.transport = request.transport
        self._uid += 1
        arrival = time.perf_counter()
        sink.arrival = arrival
        req = SimReq(self._uid, arrival, n_prompt, n_out, hash_pieces(r.pieces), sink.on_token, sink.on_finish)
        sink.req = req
        self.inflight.add(sink)
        try:
            self.engine.submit(req)
            outcome = await sink.done
        finally:
            self.inflight.discard(sink)
            if not req.done:
                self.engine.abort(req)
                self.stats.success["abort"] += 1
        if resp is None:
            if isinstance(outcome, tuple):
                return _json_error(outcome[1], outcome[0])
            if not isinstance(outcome, bytes):  # "reset": the connection is gone, nothing is sent
                return web.Response(status=500)
            return web.Response(body=outcome, content_type=JSON)
        if outcome in ("ok", "error"):
            await resp.write_eof()
        return resp

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        inp = body.get("input")
        if isinstance(inp, str):
            counts = [tokenizer.count(inp)]
        elif isinstance(inp, list) and inp and all(isinstance(x, int) for x in inp):
            counts = [len(inp)]
        elif isinstance(inp, list) and inp and all(isinstance(x, str | list) for x in inp):
            counts = [tokenizer.count(x) if isinstance(x, str) else len(x) for x in inp]
        else:
            return _bad("'input' must be a string, a list of strings, or token ids.", "input")
        for c in counts:
            if c > self.max_len:
                return _json_error(protocol.prompt_too_long(self.max_len, c), 400)
        refused = await self._admission(request, self._fault_or_none(request))
        if refused is not None:
            return refused
        total = sum(counts)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._uid += 1

        def finished(_req: SimReq, _t: float) -> None:
            if not done.done():
                done.set_result(None)

        req = SimReq(self._uid, time.perf_counter(), max(1, total), 1, [], lambda t: None, finished)
        try:
            self.engine.submit(req)
            await done
        finally:
            if not req.done:
                self.engine.abort(req)
        self.stats.prompt_tokens += total
        return web.Response(body=protocol.embeddings_body(self.model_name, len(counts), total, self.created),
                            content_type=JSON)

    def _fault_or_none(self, request: web.Request) -> RequestFault | None:
        f = self._fault(request)
        return None if isinstance(f, web.Response) else f
