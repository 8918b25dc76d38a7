"""TP versus replicas: the interconnect a candidate's all-reduces run over (`interconnect=nvlink|pcie4|pcie5`,
as the sim's `--gpu-set link_gb_s=…,link_latency_us=…`) and each TP step's scaling efficiency.

Efficiency is measured the way the method measures it: capacity at tp=k against k/j × capacity at tp=j
of the same candidate (replicas scale linearly, so 1.0 means TP is as good as replicas). Pure
arithmetic on planned capacities; never simulates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from slogate.replay.sim import catalog
from slogate.traces.usage import UsageError

# Per-GPU all-reduce bandwidth (GB/s, one direction) and fixed cost per all-reduce (µs). PCIe x16:
# 4.0 = 16 GT/s × 16 lanes ≈ 32 GB/s, 5.0 ≈ 64 GB/s per direction (PCI-SIG specifications); the fixed
# cost is the catalog's default for GPUs without NVLink, and never below the GPU's own NVLink figure
# (an A100's NCCL all-reduce starts in 42 µs over NVLink: it is not faster over PCIe). "nvlink" keeps
# the catalog's NVLink figures (catalog.py: A100 42 µs + 175 GB/s, H100/H200 8 µs + 450 GB/s).
PCIE: dict[str, tuple[float, float]] = {"pcie4": (32.0, 15.0), "pcie5": (64.0, 15.0)}
NVLINK_MIN_GB_S = 100.0  # a catalog link faster than this is NVLink
INTERCONNECTS = ("nvlink", *PCIE)


def gpu_set(gpu_name: str, interconnect: str) -> str | None:
    """The sim's `--gpu-set` for an interconnect (None: the catalog's own link is meant)."""
    gpu = catalog.find_gpu(gpu_name)
    name = interconnect.strip().lower()
    if name == "nvlink":
        if gpu.link_gb_s < NVLINK_MIN_GB_S:
            raise UsageError(f"interconnect=nvlink: {gpu.name} has no NVLink in the catalog; use interconnect=pcie4 "
                             f"or pcie5")
        return None
    if name not in PCIE:
        raise UsageError(f"bad interconnect={interconnect!r}: use one of {', '.join(INTERCONNECTS)}")
    gb_s, us = PCIE[name]
    if gpu.link_gb_s >= NVLINK_MIN_GB_S:
        us = max(us, gpu.link_latency_us)
    return f"link_gb_s={gb_s:g},link_latency_us={us:g}"


def interconnect_of(gpu_name: str, opts: dict[str, str]) -> str:
    """The interconnect a candidate's TP all-reduces use: its option, else the catalog's link."""
    given = opts.get("interconnect")
    if given:
        return given.lower()
    return "nvlink" if catalog.find_gpu(gpu_name).link_gb_s >= NVLINK_MIN_GB_S else "pcie4"


def group_key(gpu_name: str, model: str, opts: Sequence[tuple[str, str]]) -> tuple:
    """Candidates with the same key differ only in tp (same GPU, model, interconnect, other options)."""
    rest = tuple((k, v) for k, v in opts if k not in ("tp", "interconnect"))
    return (gpu_name, model, interconnect_of(gpu_name, dict(opts)), rest)


class Step(NamedTuple):
    base_tp: int | None  # the next smaller tp with a capacity (None: nothing to compare with)
    speedup: float | None  # capacity / capacity at base_tp
    efficiency: float | None  # speedup / (tp / base_tp)


def steps(members: Sequence[tuple[int, float | None]]) -> list[Step]:
    """For (tp, capacity) rows of one group: each row against the next smaller tp that has a capacity
    (1→2→4→8, one step at a time); rows in the order given."""
    order = sorted(range(len(members)), key=lambda i: members[i][0])
    out = [Step(None, None, None)] * len(members)
    prev: tuple[int, float] | None = None
    for i in order:
        tp, cap = members[i]
        if cap is None or cap <= 0:
            continue
        if prev is not None and tp > prev[0]:
            speedup = cap / prev[1]
            out[i] = Step(prev[0], round(speedup, 4), round(speedup / (tp / prev[0]), 4))
        prev = (tp, cap)
    return out


def describe(tp: int, step: Step, interconnect: str | None) -> str:
    """`tp 1→2: 1.71× (86%) nvlink`, or "–" without a smaller tp to compare with."""
    if step.base_tp is None or step.speedup is None or step.efficiency is None:
        return "–"
    return f"tp {step.base_tp}→{tp}: {step.speedup:.2f}× ({step.efficiency:.0%}) {interconnect or ''}".rstrip()
