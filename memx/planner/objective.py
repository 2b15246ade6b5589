"""Φ = T̂^wT · M̂^wM · (V̂)^wV, weight profiles and their automatic selection (paper §3.1.2).

Each term is divided by its median over feasible candidates. ε is added to V in MiB² before
normalising, V̂ = (V + ε) / (median V + ε), so that zero variance cannot drive Φ to zero and so
that comparing two plans never needs the medians: log Φ differs from
wT·log T + wM·log M + wV·log(V + ε) by a constant (used by recompute refinement and top-k).
"""

from __future__ import annotations

import numpy as np

from memx.domain.errors import InputError
from memx.domain.specs import Cluster, SearchSpace, Weights

PROFILES: dict[str, tuple[float, float, float]] = {
    "default": (0.4, 0.2, 0.4),  # strongly heterogeneous clusters (paper §3.1.2)
    "safety": (0.3, 0.5, 0.2),  # the fastest feasible plan's smallest margin < 10%
    "throughput": (0.7, 0.2, 0.1),  # homogeneous or weakly heterogeneous clusters
}
SAFETY_MARGIN = 0.10  # paper §3.1.2: "minimum predicted memory margin falls below 10%"
EPSILON_MIB2: float = SearchSpace.epsilon_mib2  # ε where no search space is at hand: its default
WEAK_HETEROGENEITY = 1.5  # our threshold on the memory-per-TFLOP spread, docs/planner.md


def parse_weights(spec: str) -> Weights | None:
    """'auto' → None (decided later); a profile name; or 'wT,wM,wV' (non-negative, sum 1)."""
    spec = spec.strip()
    if spec == "auto":
        return None
    if spec in PROFILES:
        return Weights(profile=spec, w_time=PROFILES[spec][0], w_mem=PROFILES[spec][1], w_var=PROFILES[spec][2])
    try:
        parts = [float(x) for x in spec.split(",")]
    except ValueError:
        parts = []
    if len(parts) != 3 or min(parts) < 0 or abs(sum(parts) - 1.0) > 1e-6:
        raise InputError(
            f"weights {spec!r}: allowed values are auto, {', '.join(PROFILES)} or 'wT,wM,wV' "
            "(three non-negative numbers summing to 1)"
        )
    return Weights(profile="custom", w_time=parts[0], w_mem=parts[1], w_var=parts[2])


def heterogeneity(cluster: Cluster) -> float:
    """Spread of memory per unit of compute: max/min over GPU types of memory_gib / TFLOPS.

    1.0 for one type; V100→A100 (memory and compute grew together) is ≈ 1.0; H100 + H20 is ≈ 8.
    """
    ratios = [g.memory_gib / g.peak_tflops_bf16 for g in cluster.gpu_types]
    return max(ratios) / min(ratios)


def auto_profile(cluster: Cluster, fastest_min_margin: float | None) -> Weights:
    """safety if the fastest feasible plan's smallest margin < 10%; else throughput for
    homogeneous / weakly heterogeneous clusters (heterogeneity ≤ 1.5); else default."""
    if fastest_min_margin is not None and fastest_min_margin < SAFETY_MARGIN:
        name = "safety"
    elif heterogeneity(cluster) <= WEAK_HETEROGENEITY:
        name = "throughput"
    else:
        name = "default"
    w = PROFILES[name]
    return Weights(profile=name, w_time=w[0], w_mem=w[1], w_var=w[2])


def log_score(time_ms, max_mib, var_mib2, weights: Weights, epsilon_mib2: float) -> np.ndarray:
    """log Φ up to the median constant: wT·log T + wM·log M + wV·log(V + ε)."""
    return (
        weights.w_time * np.log(time_ms)
        + weights.w_mem * np.log(max_mib)
        + weights.w_var * np.log(np.asarray(var_mib2) + epsilon_mib2)
    )


def phi(time_ms, max_mib, var_mib2, *, refs: tuple[float, float, float], weights: Weights, epsilon_mib2: float):
    """Φ with reference values refs = (median T, median M, median V) (paper §3.1.2)."""
    t_hat = np.asarray(time_ms) / refs[0]
    m_hat = np.asarray(max_mib) / refs[1]
    v_hat = (np.asarray(var_mib2) + epsilon_mib2) / (refs[2] + epsilon_mib2)
    return t_hat**weights.w_time * m_hat**weights.w_mem * v_hat**weights.w_var
