"""`slogate sim`: a simulated continuous-batching LLM engine (vLLM V1 semantics) behind the OpenAI API.

Where things live: catalog (GPUs, models, precisions) → config (SimConfig → EngineSpec) → steptime
(roofline / linear step models) → kvcache (paged blocks, prefix LRU) → scheduler (which tokens run
each step) → engine (the loop on a real or virtual clock; the virtual-time Python API) → stream,
protocol, server, prom, faults (the HTTP face) → cli. Never imports gateway.
"""

from slogate import native

BUILD = native.select(native.SIM)  # "mypyc" (make compile) or "python": which build of the hot modules runs
