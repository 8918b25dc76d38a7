"""slogate's shared core: what one LLM request looked like and how it is measured.

Pure and synchronous: record schema, metric definitions, SLOs, the SSE stream observer, trace
files, anonymization and public trace formats. Never imports `slogate.gateway` or `slogate.replay`.
"""
