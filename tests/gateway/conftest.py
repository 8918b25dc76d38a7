"""Session fixtures for gateway tests against real third-party servers (llama.cpp, Prometheus).

Each server starts once per session on a free 127.0.0.1 port and always stops; a missing binary or
model fails the test with the `make` step to run, never skips. Starters live in tests/realservers.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.otlp_receiver import otlp_receiver
from tests.realservers import start_llama, start_prometheus
from tests.servers import Server, free_port


@pytest.fixture(scope="session")
def llama_server() -> Iterator[Server]:
    """llama-cpp-python's server with Gemma 3 270M Q4_K_M (assembled once into .cache/models/)."""
    with start_llama() as server:
        yield server


@dataclass
class PrometheusForGateway:
    """A running Prometheus (`url`, scrape job `job`) that scrapes 127.0.0.1:`target_port` every 1 s.

    Start the gateway's admin listener (`--admin-listen 127.0.0.1:target_port`) there.
    """

    url: str
    job: str
    target_port: int
    server: Server


@pytest.fixture(scope="session")
def prometheus() -> Iterator[PrometheusForGateway]:
    port = free_port()
    with start_prometheus([f"127.0.0.1:{port}"], interval="1s") as server:
        yield PrometheusForGateway(url=server.url, job=server.job, target_port=port, server=server)  # type: ignore[attr-defined]


@dataclass
class Otlp:
    url: str
    bodies: dict[str, list[bytes]]  # path (/v1/traces, /v1/metrics) → the bodies received so far


@pytest.fixture
def otlp() -> Iterator[Otlp]:
    """A real OTLP/HTTP receiver (tests/otlp_receiver.py); its bodies are decoded by the tests."""
    import opentelemetry.proto  # noqa: F401  (the test extra installs it: make test)
    with otlp_receiver() as (url, bodies):
        yield Otlp(url, bodies)
