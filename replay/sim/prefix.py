"""Prefix identity of a prompt as chained hashes of its full 16-token KV blocks.

From token pieces (HTTP prompts) or from a trace's `hash_ids` of any block size (virtual runs).
Equal hashes mean equal prefixes; it never keeps prompt text beyond the hash call.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from slogate.replay.sim.kvcache import BLOCK_SIZE


def hash_pieces(pieces: Sequence[str], block_size: int = BLOCK_SIZE) -> list[Hashable]:
    """Chained hashes of the full blocks of a token-piece sequence."""
    out: list[Hashable] = []
    h = 0
    for i in range(len(pieces) // block_size):
        h = hash((h, *pieces[i * block_size:(i + 1) * block_size]))
        out.append(h)
    return out


def hash_ids_to_blocks(hash_ids: Sequence[int], block_tokens: int, prompt_tokens: int,
                       block_size: int = BLOCK_SIZE) -> list[Hashable]:
    """Map trace block ids (block_tokens tokens each, chained) onto KV blocks.

    KV block j (tokens 16j … 16j+15) is identified by the id of the trace block holding its last
    token — chained ids make that id stand for the whole prefix — and by j itself. KV blocks past
    the ids given stay unique to the request (no entry here).
    """
    out: list[Hashable] = []
    if block_tokens <= 0:
        return out
    n_ids = len(hash_ids)
    for j in range(prompt_tokens // block_size):
        k = ((j + 1) * block_size - 1) // block_tokens
        if k >= n_ids:
            break
        out.append((hash_ids[k], j))
    return out
