"""slogate: SLO-aware sidecar gateway, trace capture and faithful trace replay for LLM inference servers.

The distribution's one import package. Its subpackages are `slogate.traces` (the pure core),
`slogate.gateway` (the sidecar) and `slogate.replay` (replay, reports, the simulator); this module
holds the one version string and decides, before any of them loads, which build of the gateway's
data path runs (slogate.native: mypyc-compiled after `make compile`, else pure Python).
"""

from slogate import native as _native

__version__ = "0.2.0"
GATEWAY_BUILD = _native.select(_native.GATEWAY)  # "mypyc" or "python"
