"""Time of one collective on a link: the alpha-beta model of ring and tree algorithms.

For `n` ranks, a payload of `S` bytes (the whole buffer, as NCCL's tests count it), a link of
bandwidth `B` per direction and latency `a` per step (Thakur, Rabenseifner & Gropp 2005;
NCCL's tuning model uses the same terms):

- ring all-gather / reduce-scatter: (n-1) steps, each moving S/n: (n-1)*a + (n-1)/n * S/B
- ring all-reduce (reduce-scatter then all-gather): 2(n-1)*a + 2(n-1)/n * S/B
- tree all-reduce (pipelined double binary tree, as NCCL): 2*log2(n)*a + 2 * S/B
- broadcast: ring: (n-1)*a + S/B; tree: log2(n)*a + S/B

The link of a job is the slowest one its ring crosses: the device's intra-node link while all
ranks fit in one node, else the inter-node network (a hierarchical job is bound by it).
Bandwidths are per GPU per direction, from vendor specifications (cited per link), scaled by
`LINK_EFFICIENCY` for what NCCL reaches in practice (its "bus bandwidth").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import MemplanError, unknown_name

GBPS = 1e9
ALGORITHMS = ("ring", "tree")
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast")
# NCCL's all-reduce bus bandwidth reaches ~80-90% of the link rate on large messages (nccl-tests).
LINK_EFFICIENCY = 0.85


@dataclass(frozen=True, kw_only=True)
class Link:
    """One kind of interconnect, per GPU."""

    name: str  # short name
    bytes_per_s: float  # peak bandwidth per direction per GPU
    latency_s: float  # per algorithm step (NCCL's base latency on this link)


LINKS = {
    # NVLink 4 (H100 SXM): 900 GB/s bidirectional per GPU, 450 GB/s each way (NVIDIA H100 datasheet).
    "nvlink4": Link(name="nvlink4", bytes_per_s=450 * GBPS, latency_s=2e-6),
    # NVLink 3 (A100 SXM): 600 GB/s bidirectional, 300 GB/s each way (NVIDIA A100 datasheet).
    "nvlink3": Link(name="nvlink3", bytes_per_s=300 * GBPS, latency_s=2e-6),
    # NVLink 2 (V100 SXM2): 300 GB/s bidirectional, 150 GB/s each way (NVIDIA V100 datasheet).
    "nvlink2": Link(name="nvlink2", bytes_per_s=150 * GBPS, latency_s=2e-6),
    # PCIe x16 per direction: Gen3 15.75, Gen4 31.5, Gen5 63 GB/s (PCI-SIG).
    "pcie3": Link(name="pcie3", bytes_per_s=15.75 * GBPS, latency_s=5e-6),
    "pcie4": Link(name="pcie4", bytes_per_s=31.5 * GBPS, latency_s=5e-6),
    "pcie5": Link(name="pcie5", bytes_per_s=63 * GBPS, latency_s=5e-6),
    # InfiniBand FDR 4x: 56 Gb/s signalling, 54.5 Gb/s of data = 6.8 GB/s (DeepBench's cluster).
    "ib-fdr": Link(name="ib-fdr", bytes_per_s=6.8 * GBPS, latency_s=8e-6),
    # InfiniBand one NIC per GPU: HDR 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s (NVIDIA ConnectX-6/7).
    "ib-hdr": Link(name="ib-hdr", bytes_per_s=25 * GBPS, latency_s=8e-6),
    "ib-ndr": Link(name="ib-ndr", bytes_per_s=50 * GBPS, latency_s=8e-6),
}


def get_link(name: str) -> Link:
    """A link by name (see `LINKS`)."""
    if name not in LINKS:
        raise unknown_name("link", name, LINKS)
    return LINKS[name]


def job_link(world_size: int, gpus_per_node: int, intra: str, inter: str) -> Link:
    """The link that bounds a job's collectives: intra-node while it fits in one node."""
    return get_link(intra if world_size <= gpus_per_node else inter)


def collective_s(kind: str, nbytes: float, world_size: int, link: Link, algorithm: str = "ring") -> float:
    """Seconds for one collective (see the module docstring for the formulas).

    Args:
        kind: "all_gather", "reduce_scatter", "all_reduce" or "broadcast".
        nbytes: the whole buffer in bytes.
        world_size: ranks taking part (1: nothing moves).
        link: the link it runs on.
        algorithm: "ring" or "tree" (tree applies to all-reduce and broadcast; the others are rings).
    """
    if kind not in KINDS:
        raise MemplanError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}")
    if algorithm not in ALGORITHMS:
        raise MemplanError(f"unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    n = world_size
    if n <= 1:
        return 0.0
    alpha, beta = link.latency_s, 1.0 / (link.bytes_per_s * LINK_EFFICIENCY)
    depth = math.ceil(math.log2(n))
    if kind in ("all_gather", "reduce_scatter"):
        return (n - 1) * alpha + (n - 1) / n * nbytes * beta
    if kind == "broadcast":
        return (depth if algorithm == "tree" else n - 1) * alpha + nbytes * beta
    if algorithm == "tree":
        return 2 * depth * alpha + 2 * nbytes * beta
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta


def bus_bandwidth(kind: str, nbytes: float, world_size: int, seconds: float) -> float:
    """nccl-tests' "bus bandwidth" of a measured or predicted time (comparable across world sizes)."""
    n = world_size
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "broadcast": 1.0}[kind]
    return nbytes / seconds * factor
