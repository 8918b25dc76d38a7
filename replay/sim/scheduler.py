"""Which tokens of which requests run in the next step: vLLM V1 (and the older V0) scheduling.

V1: a token budget per step, running requests first in admission order, then waiting ones while
running < max_num_seqs; chunked prefill; preempt the newest running request when blocks run out
(recompute later). On the virtual clock, runs of plain decode steps go in one call (run_decodes).
Bookkeeping with ints and lists only: it never sleeps, never does I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable

from slogate.replay.sim.kvcache import KVCache


class SimReq:
    """Engine-side state of one request. `emit(t)` is called once per output token."""

    __slots__ = (
        "aborted", "arrival", "blocks", "cached_tokens", "done", "emit", "emit_all", "first_sched", "hashes",
        "nhashed", "num_computed", "num_generated", "on_finish", "output_tokens", "preemptions",
        "prompt_tokens", "uid",
    )

    def __init__(self, uid: int, arrival: float, prompt_tokens: int, output_tokens: int,
                 hashes: list[Hashable], emit: Callable[[float], None],
                 on_finish: Callable[[SimReq, float], None] | None = None) -> None:
        self.uid = uid
        self.arrival = arrival
        self.prompt_tokens = prompt_tokens
        self.output_tokens = max(1, output_tokens)
        self.hashes = hashes  # chained hashes of the prompt's full KV blocks
        self.emit = emit
        # several tokens at once (a run of coalesced decode steps): emit for each unless set
        self.emit_all: Callable[[list[float]], None] | None = None
        self.on_finish = on_finish
        self.num_computed = 0
        self.num_generated = 0
        self.blocks: list[int] = []
        self.nhashed = 0
        self.first_sched: float | None = None
        self.cached_tokens: int | None = None
        self.preemptions = 0
        self.done = False
        self.aborted = False

    def block_hash(self, i: int) -> Hashable:
        """Block i's chained hash: the prompt's own, else one private to this request (a negative
        int below any hash(): private_hash; ints hash and compare faster than tuples)."""
        return self.hashes[i] if i < len(self.hashes) else private_hash(self.uid, i)


PRIVATE_SHIFT = 32  # block index bits of a private hash (2**32 blocks of 16 tokens: far past any context)
# below every 64-bit hash() value, so a private hash never equals a prompt's (prefix.hash_pieces)
PRIVATE_BASE = -(1 << 64) - 1


def private_hash(uid: int, i: int) -> int:
    """Request uid's own block i: PRIVATE_BASE − (uid·2³² + i), unique per (uid, i), never a
    trace block's (hash_id, j) tuple nor a hash() of token pieces."""
    return PRIVATE_BASE - (uid << PRIVATE_SHIFT) - i


V0_MAX_PADDINGS = 256  # vLLM 0.2.x SchedulerConfig.max_paddings (its default)
V0_WATERMARK = 0.01  # vLLM 0.2.x BlockSpaceManager(watermark=0.01)


class Scheduler:
    """Forms steps over a KV cache; `schedule(now)` then `complete(t_end)` once the step ran."""

    def __init__(self, kv: KVCache, *, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: str = "v1") -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.v0 = policy == "v0"
        # V0 admits a prompt only if 1 % of the blocks stay free after it (vllm/core/block_manager.py,
        # watermark=0.01 in v0.2-0.4), so that running decodes can still grow; V1 has no watermark
        self.watermark = int(V0_WATERMARK * kv.num_blocks) if self.v0 else 0
        self.running: list[SimReq] = []
        self.waiting: deque[SimReq] = deque()
        self.batch: list[SimReq] = []  # requests in the step being run
        self.batch_tokens: list[int] = []  # their new tokens
        self.num_preemptions = 0
        self.steps = 0
        self.peak_running = 0  # most requests running at once (max_num_seqs never bound while below it)
        # shape of the last scheduled step
        self.new_tokens = 0
        self.kv_tokens = 0
        self.attn_work = 0.0
        self.run_busy: tuple[float, ...] = ()  # busy-time increments of the last run_decodes
        # a request's own (private) full blocks get their hashes only when it is preempted, the one
        # time anyone can look them up; finished, they leave as one LRU run (KVCache.free(dead=…)).
        # False: hash each as it fills. Same runs either way (test_engine), this is faster.
        self.defer_private = True

    def add(self, req: SimReq) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def abort(self, req: SimReq) -> None:
        """Drop a request wherever it is and free its blocks (client went away)."""
        if req.done:
            return
        req.done = req.aborted = True
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        self._release(req)

    def _defers(self, req: SimReq) -> bool:
        """Whether req's own full blocks are still without their hashes (never preempted: defer_private)."""
        return self.defer_private and not req.preemptions and self.kv.prefix_caching

    def _release(self, req: SimReq) -> None:
        """Free a finished or aborted request's blocks; its unhashed own full blocks go as one run."""
        nh = len(req.hashes)
        if req.nhashed > nh and self._defers(req):
            self.kv.free(req.blocks, (nh, req.nhashed))
        else:
            self.kv.free(req.blocks)
        req.blocks = []

    # -- forming a step ----------------------------------------------------------------------

    def _preempt(self, victim: SimReq) -> None:
        if self._defers(victim):
            for j in range(len(victim.hashes), victim.nhashed):  # its own full blocks: it may find them again
                self.kv.register(victim.blocks[j], victim.block_hash(j))
        self.kv.free(victim.blocks)
        victim.blocks = []
        victim.num_computed = 0
        victim.nhashed = 0
        victim.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)

    def _take(self, req: SimReq, n: int) -> None:
        c = req.num_computed
        self.batch.append(req)
        self.batch_tokens.append(n)
        self.new_tokens += n
        self.kv_tokens += c + n
        self.attn_work += n * (c + 0.5 * n)

    def _grow(self, req: SimReq, n: int) -> bool:
        """Give req blocks for n more tokens, preempting the newest running requests if needed."""
        need = (req.num_computed + n + self.kv.block_size - 1) // self.kv.block_size - len(req.blocks)
        if need <= 0:
            return True
        while True:
            got = self.kv.allocate(need)
            if got is not None:
                req.blocks += got
                return True
            victim = self.running.pop()
            self._preempt(victim)
            if victim is req:
                return False

    def _admit(self, req: SimReq, budget: int, now: float, chunked: bool, reserve: int = 0) -> int:
        """Try to start a waiting request; returns its scheduled tokens (0 = could not). `reserve`
        blocks must stay free after it (V0's watermark)."""
        kv = self.kv
        total = req.prompt_tokens + req.num_generated
        hits: list[int] = []
        # a request without prompt hashes can only find its own blocks, and only after a preemption
        if kv.prefix_caching and req.num_computed == 0 and (req.hashes or req.preemptions):
            hits = kv.lookup([req.block_hash(i) for i in range((total - 1) // kv.block_size)],
                             (total - 1) // kv.block_size)
        computed = len(hits) * kv.block_size
        n = total - computed
        if n > budget:
            if not chunked and self.batch:
                return 0
            n = budget if chunked else n
        need = (computed + n + kv.block_size - 1) // kv.block_size - len(hits)
        if need + reserve > kv.num_free() - kv.evictable_among(hits):
            return 0
        kv.touch(hits)
        req.blocks = hits + (kv.allocate(need) or [])
        req.num_computed = computed
        req.nhashed = len(hits)
        kv.queries += total
        kv.hits += computed
        if req.cached_tokens is None:
            req.cached_tokens = computed
        if req.first_sched is None:
            req.first_sched = now
        return n

    def schedule(self, now: float) -> bool:
        """Pick the next step's work; False when there is nothing to run."""
        self.batch = []
        self.batch_tokens = []
        self.new_tokens = self.kv_tokens = 0
        self.attn_work = 0.0
        if self.v0:
            self._schedule_v0(now)
        else:
            self._schedule_v1(now)
        return bool(self.batch)

    def _schedule_v1(self, now: float) -> None:
        budget = self.max_num_batched_tokens
        running = self.running
        preempted = self.num_preemptions
        bs = self.kv.block_size
        batch, batch_tokens = self.batch, self.batch_tokens
        new_tokens = kv_tokens = 0
        attn = 0.0
        i = 0
        # hot loop (every step, every running request): _take and the no-allocation case inlined
        while i < len(running) and budget > 0:
            req = running[i]
            c = req.num_computed
            n = req.prompt_tokens + req.num_generated - c
            if n > budget:
                n = budget
            if (c + n + bs - 1) // bs > len(req.blocks) and not self._grow(req, n):
                break
            batch.append(req)
            batch_tokens.append(n)
            new_tokens += n
            kv_tokens += c + n
            attn += n * (c + 0.5 * n)
            budget -= n
            i += 1
        self.new_tokens, self.kv_tokens, self.attn_work = new_tokens, kv_tokens, attn
        if self.num_preemptions != preempted:
            return
        self._admit_waiting(now, budget, chunked=True)

    def _admit_waiting(self, now: float, budget: int, *, chunked: bool) -> None:
        """Move waiting requests (arrival order) into the batch while budget and seats last."""
        running, waiting = self.running, self.waiting
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            req = waiting[0]
            if req.arrival > now:  # real clock running late: not yet arrived at this step's start
                break
            n = self._admit(req, budget, now, chunked=chunked)
            if n == 0:
                break
            waiting.popleft()
            running.append(req)
            self._take(req, n)
            budget -= n
        if len(running) > self.peak_running:
            self.peak_running = len(running)

    def _admit_padded(self, now: float) -> None:
        """V0 (vLLM 0.2-0.3) prompt batching: the batch is padded to its longest prompt, so it is
        budgeted as len(batch) × max(prompt) ≤ max_num_batched_tokens with at most V0_MAX_PADDINGS
        padding tokens, and the step computes the padded tokens (vllm/core/scheduler.py, v0.2.7)."""
        running, waiting = self.running, self.waiting
        lens: list[int] = []
        while waiting and len(running) < self.max_num_seqs:
            req = waiting[0]
            if req.arrival > now:
                break
            n = req.prompt_tokens + req.num_generated
            new = [*lens, n]
            padded = len(new) * max(new)
            if lens and (padded > self.max_num_batched_tokens or padded - sum(new) > V0_MAX_PADDINGS):
                break
            got = self._admit(req, self.max_num_batched_tokens, now, chunked=False, reserve=self.watermark)
            if got == 0:
                break
            waiting.popleft()
            running.append(req)
            self._take(req, got)
            lens.append(n)
        if len(running) > self.peak_running:
            self.peak_running = len(running)
        if len(lens) > 1:  # the padding is computed too
            pad = len(lens) * max(lens) - sum(lens)
            self.new_tokens += pad
            self.attn_work += pad * max(lens) * 0.5

    def _schedule_v0(self, now: float) -> None:
        """Prefill-first: a step with new prompts runs only those prompts (decodes stall)."""
        running = self.running
        self._admit_padded(now)
        if self.batch:
            return
        for req in list(running):
            if req.done:
                continue
            n = req.prompt_tokens + req.num_generated - req.num_computed
            if req not in running or not self._grow(req, n):
                continue
            self._take(req, n)

    # -- virtual clock: plain decode steps in one go -------------------------------------------

    def run_decodes(self, t: float, horizon: float, step: Callable[[int, int, int, float], float]
                    ) -> tuple[float, int]:
        """Run consecutive steps that only decode (nothing waiting, every running request one
        token from its next output, blocks to spare) without forming each step: the same step
        times (same jitter draws, in order) and token times as stepping one by one (blocks are
        allocated, and full ones hashed, once for the run, before any request of the last step
        finishes). The run ends with the step in which the first requests emit their last token
        (they finish as in complete(): freed in batch order, then on_finish), or after the step
        that ends at or past `horizon` (the next arrival). Returns the end time and the steps run
        (0: the next step is not such a step; form it normally)."""
        running = self.running
        b = len(running)
        if self.waiting or not b or b > self.max_num_batched_tokens:
            return t, 0
        m = 1 << 30  # steps until the first request's last token (included)
        ctx = 0
        for req in running:
            c = req.num_computed
            if c != req.prompt_tokens + req.num_generated - 1:  # prefilling (or a chunk left)
                return t, 0
            left = req.output_tokens - req.num_generated
            if left < m:
                m = left
            ctx += c
        if m < 3:  # two steps or fewer: form them one by one (the busy time sums their own durations)
            return t, 0
        kv, bs = self.kv, self.kv.block_size
        want = 0
        for r in running:
            x = (r.num_computed + m + bs - 1) // bs - len(r.blocks)
            if x > 0:
                want += x
        if want > kv.num_free():
            return t, 0  # blocks may run out on the way: the normal path preempts
        kv_tokens, attn = ctx + b, ctx + 0.5 * b  # as _schedule_v1 sums them for n = 1
        t0 = t
        run = getattr(step, "decode_run", None)  # the roofline's loop without a call per step
        if run is not None:
            times = run(t, b, kv_tokens, attn, m, horizon)
            t = times[-1]
            last_dt = step.last_dt  # type: ignore[attr-defined]
        else:
            times = []
            for _ in range(m):
                last_dt = step(b, b, kv_tokens, attn)
                t += last_dt
                times.append(t)
                if t >= horizon:
                    break
                kv_tokens += b
                attn += b
        k = len(times)
        caching = kv.prefix_caching
        finishing = False
        for req in running:  # the whole run's blocks first: the normal path allocates before it frees
            c = req.num_computed = req.num_computed + k
            g = req.num_generated = req.num_generated + k
            need = (c + bs - 1) // bs - len(req.blocks)
            if need > 0:
                req.blocks += kv.allocate(need) or []
            if caching and c >= (req.nhashed + 1) * bs:
                self._register_full(req, c)
            if req.emit_all is not None:
                req.emit_all(times)
            else:
                emit = req.emit
                for tt in times:
                    emit(tt)
            if g >= req.output_tokens:
                finishing = True
        self.steps += k
        # busy time as before the last step joined the run: the run's span, then that step's own
        self.run_busy = (times[-2] - t0, last_dt) if finishing else (t - t0,)
        if finishing:  # the last step's finished requests, in batch order (as complete() does)
            for req in running:
                if req.num_generated >= req.output_tokens:
                    req.done = True
                    self._release(req)
                    if req.on_finish is not None:
                        req.on_finish(req, t)
            self.running = [r for r in running if not r.done]
        return t, k

    def _register_full(self, req: SimReq, computed: int) -> None:
        """Give the request's newly full blocks their chained hashes (prefix caching)."""
        kv = self.kv
        full = computed // kv.block_size
        top = min(full, len(req.hashes)) if self._defers(req) else full
        for j in range(req.nhashed, top):
            kv.register(req.blocks[j], req.block_hash(j))
        req.nhashed = full

    # -- finishing a step --------------------------------------------------------------------

    def complete(self, t_end: float) -> int:
        """The step ran until t_end: advance computed tokens, emit one token per finished prompt."""
        self.steps += 1
        kv = self.kv
        bs = kv.block_size
        caching = kv.prefix_caching
        block_hash, by_hash = kv._hash, kv._by_hash
        defer = self.defer_private
        finished = 0
        for req, n in zip(self.batch, self.batch_tokens, strict=True):
            if req.aborted:
                continue
            c = req.num_computed = req.num_computed + n
            if caching and c >= (req.nhashed + 1) * bs:
                full = c // bs
                blocks, hashes = req.blocks, req.hashes
                nh = len(hashes)
                private = PRIVATE_BASE - (req.uid << PRIVATE_SHIFT)  # private_hash(uid, j) = private - j
                top = min(full, nh) if defer and not req.preemptions else full  # self._defers, inlined
                for j in range(req.nhashed, top):  # kv.register, inlined (hot: every full block)
                    b = blocks[j]
                    h = hashes[j] if j < nh else private - j
                    if block_hash[b] is None and h not in by_hash:
                        block_hash[b] = h
                        by_hash[h] = b
                req.nhashed = full
            if c >= req.prompt_tokens + req.num_generated:
                g = req.num_generated = req.num_generated + 1
                req.emit(t_end)
                if req.aborted:
                    continue
                if g >= req.output_tokens:
                    req.done = True
                    finished += 1
                    self._release(req)
                    if req.on_finish is not None:
                        req.on_finish(req, t_end)
        if finished:
            self.running = [r for r in self.running if not r.done]
        return finished
