"""One k-means (Lloyd) iteration as a trainable step (the k-means workload of papers 000/002).

The centroids are a parameter ``C (k, d)``. The forward pass computes the full point-to-centroid
squared-distance matrix ``D (n, k)`` (the big buffer, as in kmcuda), assigns every point to its
nearest centroid, and returns ``sum_i D[i, a_i] / n_{a_i}`` where ``n_j`` is the size of cluster
j. Its gradient for centroid j is ``2 (C_j - mean of its points)``, so one plain SGD step with
learning rate 1/2 moves every non-empty centroid exactly to its cluster mean: the Lloyd update.
Empty clusters get no gradient and stay. Every shape is static (no ``bincount``, no ``.item()``),
so it traces under fake tensors.
"""

from __future__ import annotations

import torch
from torch import nn

# The SGD learning rate that turns one gradient step into one Lloyd update.
LLOYD_LR = 0.5


class KMeansStep(nn.Module):
    """Learnable centroids; ``forward(points)`` returns the cluster-size-weighted distortion."""

    def __init__(self, n_clusters: int, dim: int):
        super().__init__()
        self.centroids = nn.Parameter(torch.randn(n_clusters, dim))

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        c = self.centroids
        dist = (points * points).sum(1, keepdim=True) - 2 * points @ c.t() + (c * c).sum(1)
        assign = dist.detach().argmin(1)
        counts = torch.zeros(c.shape[0], dtype=points.dtype, device=points.device)
        counts = counts.scatter_add(0, assign, torch.ones_like(assign, dtype=points.dtype))
        nearest = dist.gather(1, assign[:, None]).squeeze(1)
        return (nearest / counts[assign]).sum()


def points_inputs(batch: int, config: dict, input_size) -> tuple:
    """`batch` random points in ``dim`` dimensions (no targets: k-means is unsupervised)."""
    return (torch.randn(batch, config["dim"]),)


def build(config: dict, input_size) -> nn.Module:
    """Zoo builder: n_clusters and dim from `config`."""
    return KMeansStep(config["n_clusters"], config["dim"])
