"""Scheduler and KV-cache units: token budget, chunked prefill, preemption, prefix hits, V0 vs V1."""

from __future__ import annotations

from slogate.replay.sim.catalog import find_gpu, find_model
from slogate.replay.sim.kvcache import KVCache, kv_blocks_for
from slogate.replay.sim.scheduler import Scheduler, SimReq


def req(uid: int, prompt: int, out: int, hashes=None, times=None) -> SimReq:
    times = [] if times is None else times
    return SimReq(uid, 0.0, prompt, out, list(hashes or []), times.append)


def run_until_done(s: Scheduler, limit: int = 10_000) -> int:
    t = 0.0
    for _ in range(limit):
        if not s.has_work():
            return s.steps
        assert s.schedule(t)
        t += 0.01
        s.complete(t)
    raise AssertionError("did not finish")


def test_budget_and_chunked_prefill():
    s = Scheduler(KVCache(1000), max_num_seqs=8, max_num_batched_tokens=512)
    times: list[float] = []
    s.add(req(1, 1200, 3, times=times))
    s.schedule(0.0)
    assert s.batch_tokens == [512]  # chunk 1
    s.complete(0.01)
    assert times == []  # prompt not finished: no token yet
    s.schedule(0.01)
    assert s.batch_tokens == [512]
    s.complete(0.02)
    s.schedule(0.02)
    assert s.batch_tokens == [176]  # last chunk: first token at the end of this step
    s.complete(0.03)
    assert times == [0.03]
    s.schedule(0.03)
    assert s.batch_tokens == [1]  # decode: one token per step


def test_running_first_then_waiting_and_max_num_seqs():
    s = Scheduler(KVCache(1000), max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(3):
        s.add(req(i, 60, 5))
    s.schedule(0.0)
    assert [r.uid for r in s.batch] == [0, 1] and s.batch_tokens == [60, 40]  # budget split, chunked
    s.complete(0.01)
    s.schedule(0.01)
    assert [r.uid for r in s.batch] == [0, 1] and s.batch_tokens == [1, 20]  # running first; seqs cap
    assert len(s.waiting) == 1


def test_preemption_when_kv_is_tiny():
    s = Scheduler(KVCache(12), max_num_seqs=8, max_num_batched_tokens=2048)
    reqs = [req(i, 48, 40) for i in range(3)]  # each needs 6 blocks at the end: 18 > 12
    for r in reqs:
        s.add(r)
    run_until_done(s)
    assert s.num_preemptions > 0
    assert all(r.num_generated == 40 for r in reqs)  # a stall, never an error
    assert s.kv.used == 0
    assert max(r.preemptions for r in reqs) >= 1
    assert reqs[0].preemptions == 0  # the newest is the victim, never the oldest


def test_prefix_hits_when_prompts_share_prefixes():
    kv = KVCache(1000)
    s = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=2048)
    shared = [("p", i) for i in range(10)]  # 10 full blocks = 160 tokens
    a = req(1, 170, 2, hashes=shared)
    s.add(a)
    run_until_done(s)
    b = req(2, 170, 2, hashes=shared)
    s.add(b)
    s.schedule(1.0)
    assert b.cached_tokens == 160 and s.batch_tokens == [10]
    assert kv.hits == 160 and kv.queries == 340
    c = req(3, 160, 2, hashes=shared)  # hits capped below the prompt length: last block recomputed
    run_until_done(s)
    s.add(c)
    s.schedule(2.0)
    assert c.cached_tokens == 144


def test_lru_evicts_freed_blocks_oldest_first():
    kv = KVCache(4)
    a = kv.allocate(2)
    kv.register(a[0], "x")
    kv.register(a[1], "y")
    kv.free(a)
    assert kv.lookup(["x", "y"], 2) == a
    b = kv.allocate(3)  # two never-hashed blocks, then the LRU's oldest (tail "y" freed first)
    assert b is not None and kv.lookup(["x"], 1) == [a[0]] and kv.lookup(["x", "y"], 2) == [a[0]]
    assert kv.allocate(2) is None


def test_lru_order_survives_blocks_taken_back_many_times():
    """The LRU is a queue with lazy deletion: a block taken back (a prefix hit) leaves a stale entry
    and is queued again when freed, so it moves to the young end; thousands of such cycles compact
    the queue and the eviction order stays oldest-freed first."""
    kv = KVCache(8)
    blocks = kv.allocate(3)
    for b, h in zip(blocks, "abc", strict=True):
        kv.register(b, h)
    for b in blocks:
        kv.free([b])  # freed a, b, c in that order
    hit = kv.lookup(["b"], 1)
    for _ in range(3000):  # "b" taken back and freed again: stale entries pile up, then are dropped
        kv.touch(hit)
        kv.free(hit)
    assert len(kv._lru) <= 2 * kv.num_blocks + 1024 + 1 and kv.num_free() == 8 and kv.used == 0
    assert kv.allocate(6) is not None  # five never-hashed blocks, then the oldest cached: "a"
    assert kv.lookup(["a"], 1) == [] and kv.lookup(["c"], 1) != [] and kv.lookup(["b"], 1) == hit
    assert kv.allocate(1) is not None  # then "c": "b" was freed last
    assert kv.lookup(["c"], 1) == [] and kv.lookup(["b"], 1) == hit and kv.num_free() == 1


def test_v0_prefill_first_stalls_decodes():
    def decode_stalls(policy: str) -> int:
        s = Scheduler(KVCache(2000), max_num_seqs=8, max_num_batched_tokens=8192, policy=policy)
        s.add(req(0, 32, 50))
        t, stalls = 0.0, 0
        for step in range(60):
            if step in (5, 10, 15):
                s.add(req(step, 1000, 5))
            s.schedule(t)
            if s.running and s.running[0].uid == 0 and s.running[0] not in s.batch:
                stalls += 1
            t += 0.01
            s.complete(t)
        return stalls

    assert decode_stalls("v1") == 0  # chunked prefill: decodes ride along with new prompts
    assert decode_stalls("v0") == 3  # a prefill-only step for each arrival


def test_kv_blocks_from_memory():
    n = kv_blocks_for(find_gpu("H100-SXM"), find_model("llama-3-8b"))
    assert 25_000 < n < 30_000  # ~55 GiB / 2 MiB per block
    assert kv_blocks_for(find_gpu("h200"), find_model("llama-3-70b"), tp=4) > 0


def test_abort_frees_blocks():
    s = Scheduler(KVCache(100), max_num_seqs=8, max_num_batched_tokens=2048)
    r = req(1, 100, 50)
    s.add(r)
    s.schedule(0.0)
    s.complete(0.01)
    assert s.kv.used == 7
    s.abort(r)
    assert s.kv.used == 0 and not s.has_work()
