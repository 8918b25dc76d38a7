"""Session derivation benchmark: writer-thread CPU per captured record for prefix continuation.

N concurrent conversations of T turns (a shared system prompt, each turn appending an answer and a
question), interleaved as a gateway would complete them, go through `PrefixHasher` (the capture's
prefix ids) and `gateway.sessions.SessionDeriver`. Reports µs per record for hashing and for the
derivation, and checks every conversation came back as one session with turns 0…T−1. Prints a table;
writes tests/bench/results/session_derivation.json.

    .venv/bin/python tests/bench/session_derivation.py [--conversations 200] [--turns 10]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

from bench_output import aligned_rows, save_json

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def run(conversations: int, turns: int, final_kb: int) -> dict[str, float | int]:
    from slogate.gateway.sessions import SessionDeriver
    from slogate.traces.anonymize import PrefixHasher
    from slogate.traces.record import RequestRecord

    hasher = PrefixHasher(b"bench salt")
    derive = SessionDeriver(hasher)
    system = b"system\0" + b"You are a coding agent working in a large repository. " * 40
    prompts = [bytearray(system) for _ in range(conversations)]
    step = max(64, (final_kb * 1024 - len(system)) // turns)
    hash_s = derive_s = 0.0
    t = 0.0
    owner: dict[int, list[RequestRecord]] = defaultdict(list)
    for k in range(turns):
        for i, prompt in enumerate(prompts):
            prompt += b"user\0" + (f"conversation {i} turn {k}: ".encode() * (step // 24 + 1))[:step] + b"\0"
            data = bytes(prompt)
            record = RequestRecord(t=t, e2e=0.001)
            t += 0.002
            a = time.perf_counter()
            record.hash_ids = hasher(data)
            b = time.perf_counter()
            derive(record, data, None)
            c = time.perf_counter()
            hash_s += b - a
            derive_s += c - b
            owner[i].append(record)
            prompt += b"assistant\0" + b"done. " * 8 + b"\0"
    whole = sum(1 for recs in owner.values() if len({r.session for r in recs}) == 1
                and [r.turn for r in recs] == list(range(turns)))
    n = conversations * turns
    return {"conversations": conversations, "turns": turns, "final_prompt_kb": len(prompts[0]) // 1024,
            "hash_us_per_record": hash_s / n * 1e6, "derive_us_per_record": derive_s / n * 1e6,
            "conversations_recovered": whole}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=200)
    p.add_argument("--turns", type=int, default=10)
    ns = p.parse_args()
    results = [run(ns.conversations, ns.turns, kb) for kb in (8, 100)]
    rows = [["conversations × turns", "final prompt", "hash µs/record", "derive µs/record", "recovered"]]
    for r in results:
        rows.append([f"{r['conversations']} × {r['turns']}", f"{r['final_prompt_kb']} KB",
                     f"{r['hash_us_per_record']:.1f}", f"{r['derive_us_per_record']:.1f}",
                     f"{r['conversations_recovered']}/{r['conversations']}"])
    print("\n".join(aligned_rows(rows)))
    save_json(REPO / "tests" / "bench" / "results" / "session_derivation.json", {"runs": results})
    return 0 if all(r["conversations_recovered"] == r["conversations"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
