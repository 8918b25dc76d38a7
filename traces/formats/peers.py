"""The commands that run an exported Mooncake file in the peers' load generators (AIPerf, vLLM
`bench serve`, SGLang `bench_serving`, guidellm), printed by `slogate trace convert --to mooncake`.

Pure text from the file path and the records' lengths/times; never runs a tool or reads the network.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from slogate.traces.record import RequestRecord

MOONCAKE_BLOCK_TOKENS = 512  # each hash id is one 512-token block (vLLM's timed_trace must be told)


def mooncake_commands(path: str, records: Sequence[RequestRecord], *, url: str = "http://127.0.0.1:8000",
                      model: str = "MODEL") -> str:
    """Copy-paste commands; URL and MODEL are placeholders to replace."""
    f = shlex.quote(path)
    host, _, port = url.removeprefix("http://").partition(":")
    n = len(records)
    span = (records[-1].t - records[0].t) if n > 1 else 0.0
    rate = (n - 1) / span if span > 0 else 1.0
    ins = [r.input_tokens for r in records if r.input_tokens is not None]
    outs = [r.output_tokens or r.max_tokens for r in records if (r.output_tokens or r.max_tokens)]
    mean_in = round(sum(ins) / len(ins)) if ins else 512
    mean_out = round(sum(outs) / len(outs)) if outs else 128
    return f"""\
run it in a peer (replace {url} and {model}):
  # AIPerf: replays the timestamps (fixed schedule) and the hash_ids' prefix sharing
  aiperf profile --model {model} --url {url} --endpoint-type chat --streaming \\
      --input-file {f} --custom-dataset-type mooncake_trace --fixed-schedule
  # vLLM bench serve: timestamps are milliseconds and each hash id is a {MOONCAKE_BLOCK_TOKENS}-token block
  vllm bench serve --backend openai-chat --endpoint /v1/chat/completions --base-url {url} --model {model} \\
      --dataset-name timed_trace --dataset-path {f} \\
      --timed-trace-chunk-hash-size {MOONCAKE_BLOCK_TOKENS} --timed-trace-sec-multiplier 0.001 --num-prompts {n}
  # SGLang bench_serving (--backend vllm-chat for a vLLM server)
  python3 -m sglang.bench_serving --backend sglang --host {host} --port {port or 80} --model {model} \\
      --dataset-name mooncake --dataset-path {f} --use-trace-timestamps true --mooncake-slowdown-factor 1.0 \\
      --num-prompts {n}
  # guidellm reads no Mooncake timing or prefix ids: the closest is Poisson at the trace's mean rate and lengths
  guidellm benchmark --target {url} --model {model} --rate-type poisson --rate {rate:.3g} --max-requests {n} \\
      --data 'prompt_tokens={mean_in},output_tokens={mean_out}'"""
