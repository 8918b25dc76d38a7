"""Small real traces shipped with slogate (see README.md here for sources, licences, attribution).

`path(name)` gives a filesystem path to a sample; never modify the files (they are byte slices).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

AZURE_CONV = "azure_conv_10min.csv"
AZURE_CODE = "azure_code_10min.csv"
MOONCAKE_CONVERSATION = "mooncake_conversation_10min.jsonl"
BURSTGPT = "burstgpt_sample.csv"
SAMPLES = (AZURE_CONV, AZURE_CODE, MOONCAKE_CONVERSATION, BURSTGPT)


def path(name: str) -> Path:
    """Path of a bundled sample, e.g. `path("azure_conv_10min.csv")`."""
    if name not in SAMPLES:
        raise FileNotFoundError(f"no bundled sample {name!r}: choose one of {', '.join(SAMPLES)}")
    return Path(str(resources.files(__package__).joinpath(name)))
