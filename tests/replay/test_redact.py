"""What a recorded command line keeps: every argument, never a secret value (replay.redact)."""

from __future__ import annotations

import pytest

from slogate.replay.redact import redact


@pytest.mark.parametrize(("given", "kept"), [
    (["--api-key", "sk-1"], ["--api-key", "***"]),
    (["--api-key=sk-1"], ["--api-key=***"]),
    (["--hf-token", "hf_1"], ["--hf-token", "***"]),
    (["--header", "X-Api-Key:k1"], ["--header", "X-Api-Key:***"]),
    (["--header=Authorization:Basic QkFT"], ["--header=Authorization:***"]),
    (["-H", "api-key: k2"], ["-H", "api-key:***"]),
    (["--header", "no-colon-secret"], ["--header", "***"]),
    (["Authorization: Bearer t"], ["Authorization:***"]),
    (["--serve-cmd", "vllm serve m --api-key sk-3 --port {port}"],
     ["--serve-cmd", "vllm serve m --api-key '***' --port '{port}'"]),
    (["--serve-cmd", "vllm serve 'unbalanced"], ["--serve-cmd", "***"]),
    (["--label", "gpu=h100", "--rate", "5", "trace.csv"], ["--label", "gpu=h100", "--rate", "5", "trace.csv"]),
])
def test_secret_values_go_names_and_other_arguments_stay(given: list[str], kept: list[str]) -> None:
    assert redact(["slogate", "replay", *given]) == ["slogate", "replay", *kept]
