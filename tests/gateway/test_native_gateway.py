"""The gateway's compiled data path (`make compile`, slogate/native.py's GATEWAY group): what runs here,
and the same bytes to the client and the same records as pure Python (SLOGATE_PURE=1), through a real
gateway in front of the sim. The stale-build fallback is tested with the simulator's in tests/sim/test_native.py."""

from __future__ import annotations

import orjson
import pytest

import slogate
from slogate import native
from slogate.traces.reader import read_trace
from tests.gateway.fixtures_gateway import SIM_MODEL, http_request, metric_samples
from tests.realservers import start_gateway
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(120)

REQUESTS = [  # streamed with usage, streamed without (the gateway injects it), whole, an upstream error
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello there"}], "stream": True,
                              "stream_options": {"include_usage": True}, "max_tokens": 12}),
    ("/v1/completions", {"prompt": "one two three four", "stream": True, "max_tokens": 9}),
    ("/v1/completions", {"prompt": "one two", "max_tokens": 5}),
    ("/v1/embeddings", {"input": "a b c"}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0, "n": "bad"}),
]


def test_the_gateway_data_path_is_compiled_here():
    """`make test` builds it (make compile): the suite's gateways run the compiled data path."""
    assert slogate.GATEWAY_BUILD == "mypyc", "the gateway is not compiled here: run `make compile`"
    import importlib

    for name in native.GROUPS[native.GATEWAY][1]:
        path = importlib.import_module(name).__file__
        assert path is not None and path.endswith(".so"), path
    assert native.stale(native.GATEWAY) is None


def _shape(body: bytes) -> list:
    """What the client got, without what differs per request (ids, timestamps): per SSE event or JSON
    document, its keys and token counts."""
    docs = [line.removeprefix(b"data: ") for line in body.split(b"\n") if line.startswith(b"data: ")] or [body]
    out = []
    for doc in docs:
        if doc == b"[DONE]":
            out.append("[DONE]")
            continue
        d = orjson.loads(doc)
        out.append((sorted(d), d.get("usage"), [sorted(c) for c in d.get("choices", ())]))
    return out


def _run(tmp, pure: bool) -> tuple[list, list, str]:
    env = {"SLOGATE_PURE": "1"} if pure else {"SLOGATE_PURE": "0"}
    got = []
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1, seed=1) as sim, \
            start_gateway(sim.url, trace_dir=tmp, slos=["ttft=1,tpot=0.5"], env=env) as gw:
        for path, body in REQUESTS:
            status, headers, data = http_request(gw.url, "POST", path, orjson.dumps({"model": SIM_MODEL, **body}),
                                                 {"Content-Type": "application/json"})
            got.append((status, headers.get("content-type"), _shape(data) if status == 200 else data))
        build = [labels["build"] for labels, _ in metric_samples(gw.admin_url)["slogate_build_info"]]
    records = [(r.endpoint, r.stream, r.status, r.error, r.input_tokens, r.output_tokens, r.tokens_source,
                len(r.chunk_times or ()), r.ttft is not None) for r in read_trace(tmp).records]
    return got, records, build[0]


def test_compiled_and_pure_gateways_relay_the_same_and_record_the_same(tmp_path):
    compiled, compiled_records, compiled_build = _run(tmp_path / "c", pure=False)
    pure, pure_records, pure_build = _run(tmp_path / "p", pure=True)
    assert (compiled_build, pure_build) == ("mypyc", "python")  # slogate_build_info{build}
    assert compiled == pure
    assert compiled_records == pure_records and len(compiled_records) == len(REQUESTS)
    assert [s for s, _, _ in compiled][:4] == [200] * 4 and compiled[4][0] >= 400  # every path ran
    assert compiled_records[1][6] == "usage"  # the injected usage was read back


def test_no_compiled_module_holds_a_struct_whose_annotations_mypyc_dropped():
    """mypyc keeps a class's plain annotations but turns a union or generic one (`str | None`,
    `list[int]`) into `type`, which msgspec would then decode by: a module with such a Struct stays out
    of the group (slogate/native.py says which were left out and why)."""
    import importlib
    import inspect

    import msgspec

    structs = []
    for name in native.GROUPS[native.GATEWAY][1]:
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if inspect.isclass(cls) and issubclass(cls, msgspec.Struct) and cls.__module__ == name:
                structs.append(cls)
                assert type not in cls.__annotations__.values(), (name, cls.__name__, cls.__annotations__)
    assert structs  # the check looked at some (status.StatusRow: a float and a RequestRecord)
