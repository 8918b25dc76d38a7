"""The paged KV cache: fixed 16-token blocks, reference counts, prefix caching with an LRU.

Blocks whose tokens are all computed get a chained hash; freed hashed blocks stay findable in an
LRU until evicted, as in vLLM's block pool. The LRU is a queue with lazy deletion (a block taken back
leaves a stale entry that eviction skips): the same order as an ordered dict at a fraction of the
cost per block. A finished request's own blocks, which nobody can look up again, keep their place in
it as one run (a list entry) instead of one entry and one hash each. Pure bookkeeping with ints:
never timing, never I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence

from slogate.replay.sim.catalog import GiB, Gpu, Model, precision

BLOCK_SIZE = 16
ACTIVATION_RESERVE_GIB = 1.5  # activations, CUDA graphs and allocator slack per GPU


def kv_blocks_for(gpu: Gpu, model: Model, *, tp: int = 1, dtype: str = "bf16", kv_bytes: float = 2.0,
                  gpu_memory_utilization: float = 0.9, block_size: int = BLOCK_SIZE) -> int:
    """Blocks that fit: (GPU memory × utilization − weights − reserve) per GPU, over KV bytes per block."""
    b_w = precision(dtype).weight_bytes
    weights = model.params_b * 1e9 * b_w / tp
    free = gpu.memory_gib * GiB * gpu_memory_utilization - weights - ACTIVATION_RESERVE_GIB * GiB
    kv_heads_per_gpu = max(model.kv_heads, tp) / tp
    per_block = 2 * model.layers * kv_heads_per_gpu * model.head_dim * kv_bytes * block_size
    return max(0, int(free // per_block))


class KVCache:
    """Block pool: allocate/free by count, look up cached prefixes, count prefix queries/hits in tokens."""

    def __init__(self, num_blocks: int, *, block_size: int = BLOCK_SIZE, prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # never-hashed free blocks (stack)
        # freed hashed blocks, oldest first, lazily: an int entry counts only if it is its block's
        # last one (_entries[b] == 1 when popped) and the block is still free (ref 0); a list entry is
        # a run of unhashed blocks nobody can take back (free(dead=…)), evicted from its end
        self._lru: deque[int | list[int]] = deque()
        self._entries = [0] * num_blocks  # queue entries per block
        self._nlru = 0  # blocks the LRU holds (its live entries)
        self._ref = [0] * num_blocks
        self._hash: list[Hashable | None] = [None] * num_blocks
        self._by_hash: dict[Hashable, int] = {}
        self.used = 0
        self.queries = 0  # prefix-cache queries, tokens (vLLM: prompt tokens looked up)
        self.hits = 0  # prefix-cache hits, tokens

    def num_free(self) -> int:
        return len(self._free) + self._nlru

    def usage(self) -> float:
        return self.used / self.num_blocks if self.num_blocks else 0.0

    def lookup(self, hashes: Sequence[Hashable], max_blocks: int) -> list[int]:
        """Cached blocks for the longest matching prefix (at most max_blocks); touches nothing."""
        out: list[int] = []
        if not self.prefix_caching:
            return out
        by_hash = self._by_hash
        for h in hashes[:max_blocks]:
            b = by_hash.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def evictable_among(self, blocks: Sequence[int]) -> int:
        """How many of these blocks sit in the LRU (taking them shrinks the free count)."""
        ref = self._ref
        return sum(1 for b in blocks if ref[b] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        ref = self._ref
        for b in blocks:
            if ref[b] == 0:  # out of the LRU: its queue entry goes stale (ref > 0)
                self._nlru -= 1
                self.used += 1
            ref[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """n fresh blocks (evicting least recently freed cached blocks), or None when they do not fit."""
        free, ref = self._free, self._ref
        k = len(free)
        if n > k + self._nlru:
            return None
        self.used += n
        if n <= k:  # the never-hashed stack first: one slice, no per-block pops
            if n == 1:
                b = free.pop()
                ref[b] = 1
                return [b]
            out = free[k - n:]
            del free[k - n:]
            out.reverse()
            for b in out:
                ref[b] = 1
            return out
        out = free[::-1]
        free.clear()
        for b in out:
            ref[b] = 1
        hashes, by_hash, entries, lru = self._hash, self._by_hash, self._entries, self._lru
        popleft, append = lru.popleft, out.append
        need = n - k
        self._nlru -= need
        while need:
            head = lru[0]
            if isinstance(head, list):  # a run of dead blocks, stored last-evicted first: take from its end
                run = head
                if len(run) > need:
                    taken = run[-need:]
                    del run[-need:]
                else:
                    popleft()
                    taken = run
                taken.reverse()
                for d in taken:
                    ref[d] = 1
                out += taken
                need -= len(taken)
                continue
            popleft()
            b = head
            e = entries[b] = entries[b] - 1
            if e or ref[b]:  # stale: the block was freed again later, or is in use
                continue
            del by_hash[hashes[b]]  # a hashed block is always its hash's entry (register sets both)
            hashes[b] = None
            ref[b] = 1
            append(b)
            need -= 1
        return out

    def free(self, blocks: list[int], dead: tuple[int, int] = (0, 0)) -> None:
        """Release a request's blocks, tail first so that prefix heads are evicted last.

        `dead = (lo, hi)`: blocks[lo:hi] are full blocks of a finished request that only it could
        have looked up (held by it alone, never given a hash: Scheduler's private blocks). They take
        the LRU place that hashed blocks would take, as one run, and leave it as unhashed blocks."""
        lo, hi = dead
        if hi <= lo:
            self._release(reversed(blocks))
            return
        self._release(reversed(blocks[hi:]))
        run = blocks[lo:hi]  # a copy; evicted tail first, so stored in block order (allocate takes from the end)
        ref = self._ref
        for b in run:
            ref[b] = 0
        self._lru.append(run)
        self._nlru += len(run)
        self.used -= len(run)
        self._release(reversed(blocks[:lo]))

    def _release(self, blocks: Iterable[int]) -> None:
        ref, hashes, free, entries = self._ref, self._hash, self._free, self._entries
        queue = self._lru.append
        released = cached = 0
        for b in blocks:
            r = ref[b] = ref[b] - 1
            if r == 0:
                released += 1
                if hashes[b] is None:
                    free.append(b)
                else:
                    queue(b)
                    entries[b] += 1
                    cached += 1
        self.used -= released
        self._nlru += cached
        if len(self._lru) > 2 * self.num_blocks + 1024:  # many stale entries (blocks taken back): drop them
            self._compact()

    def _compact(self) -> None:
        """Rebuild the queue from its live entries, in order (a block's last entry, if still free)."""
        ref, entries = self._ref, self._entries
        live: list[int | list[int]] = []
        for b in self._lru:
            if isinstance(b, list):  # a run of dead blocks: never stale
                live.append(b)
                continue
            e = entries[b] = entries[b] - 1
            if e == 0 and ref[b] == 0:
                live.append(b)
        for b in live:
            if not isinstance(b, list):
                entries[b] = 1
        self._lru = deque(live)

    def register(self, block: int, h: Hashable) -> None:
        """A block is full of computed tokens: make it findable under its chained hash."""
        if self.prefix_caching and self._hash[block] is None and h not in self._by_hash:
            self._hash[block] = h
            self._by_hash[h] = block
