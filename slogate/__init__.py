"""slogate: SLO-aware sidecar gateway, trace capture and faithful trace replay for LLM inference servers.

The distribution's one import package. Its subpackages are `slogate.traces` (the pure core),
`slogate.gateway` (the sidecar) and `slogate.replay` (replay, reports, the simulator); this module
holds the one version string and imports nothing.
"""

__version__ = "0.2.0"
