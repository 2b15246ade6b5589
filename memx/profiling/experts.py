"""The minimal-set design extended to mixture-of-experts layers (issue #27; docs/profiling.md §Mixture of experts).

A MoE model's stage is profiled as what it is — its MoE layers at an expert-parallel size ep, measured with the
experts, router and all-to-all (memx.simulator.moe on the virtual cluster) — and recorded with its MoE signature
(memx.domain.records.MOE_COLUMNS: the model's expert fields, ep, and the all-to-all's link) beside the dense
equivalent's model columns, the signature the search asks a stage predictor for (memx.planner.moe).

Which ep values: the search's `expert_parallel_options` that divide the experts and whose ep group (ep TP groups)
fits on the GPU type's GPUs. Three designs (`MOE_LAYERS`, memx.profiling.profile(moe_layers=...)):
- "points" (the default, by bench/moe_learned.py): the minimal-set design of the dense equivalent as for a dense
  model, plus MoE points at every searched ep and tp whose group fits (`memx.profiling.design.ep_points`): one layer
  and the default layer count (slope and intercept of what ep changes per layer: experts per GPU — static memory and
  the tokens each local expert's GEMM gets —, the all-to-all's link and volume), and the default layer count at the
  largest inflight with no and with full recompute (the experts' activations per micro batch held). The learned
  predictor learns the MoE rows' difference from the dense design where the closed form's expert terms miss it.
- "all": every point of the minimal-set design a MoE stage at one ep, `main`: the largest whose group fits inside
  one node at the design's middle tp (the fewest experts per GPU: most layers fit; the intra-node link most plans'
  groups use), or below it where that group does not fit at a tp (`ExpertDesign.ep_for`); the other eps get the
  one-layer and default-layer points.
- "none": the dense equivalent only (before issue #27; the closed form adds every expert term).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memx.domain.errors import InputError
from memx.domain.moe_records import expert_group_plan, model_moe_fields
from memx.domain.specs import Cluster, ModelArch, SearchSpace
from memx.planner import moe
from memx.planner.space import valid_tps


@dataclass(frozen=True, kw_only=True)
class ExpertDesign:
    """Which expert-parallel sizes a profile of a MoE model measures, per GPU type (module docstring)."""

    model: ModelArch  # the MoE model (its dense equivalent is what the points' model columns hold)
    cluster: Cluster
    eps: dict[str, tuple[int, ...]]  # GPU type → searched ep values whose group fits on its GPUs (tp 1)
    main: dict[str, int]  # GPU type → the ep of the minimal-set design
    everywhere: bool = True  # every point a MoE stage (MOE_LAYERS "all"); False: the ep points only ("points")
    _links: dict = field(default_factory=dict, repr=False, compare=False)

    def ep_for(self, gpu: str, tp: int) -> int:
        """The design's ep at `tp`: `main`, or the largest searched ep below it whose group fits on the GPU type's
        GPUs at that tp (a tp-8 stage on 16 GPUs has at most 2 replicas)."""
        return max((e for e in self.eps[gpu] if e <= self.main[gpu] and fits(self, gpu, tp, e)), default=1)

    def columns(self, point: dict[str, Any]) -> dict[str, Any]:
        """The MoE columns of a point at its `expert_parallel` (the GPU type's `main` where it names none): the
        model's expert fields, ep, and the link its ep group's all-to-all crosses (memx.planner.moe.a2a_links of
        the group's placement, memx.domain.records.expert_group_plan) — what the planner hands a predictor."""
        ep = int(point.get("expert_parallel") or self.ep_for(point["gpu"], int(point["tp"])))
        key = (point["gpu"], int(point["tp"]), ep, bool(point.get("sequence_parallel")))
        if key not in self._links:
            probe = {**point, "expert_parallel": ep, "layers": max(int(point["layers"]), 1)}
            self._links[key] = moe.a2a_links(self.cluster, expert_group_plan(probe))[0][:2] if ep > 1 else (0.0, 0.0)
        gbps, lat = self._links[key]
        return {**model_moe_fields(self.model), "expert_parallel": ep, "expert_dp": 1, "a2a_gbps": float(gbps),
                "a2a_latency_ms": float(lat)}


MOE_LAYERS = ("all", "points", "none")  # memx.profiling.profile(moe_layers=...): what a MoE model's profile measures


def expert_design(cluster: Cluster, model: ModelArch, space: SearchSpace, mode: str = "points") -> ExpertDesign | None:
    """The ep values to measure for a MoE model (module docstring); None for a dense model or mode "none"."""
    if mode not in MOE_LAYERS:
        raise InputError(f"moe_layers {mode!r}; allowed: {', '.join(MOE_LAYERS)}")
    if not model.is_moe or mode == "none":
        return None
    eps, main = {}, {}
    for g in cluster.gpu_types:
        count = sum(n.count for n in cluster.nodes if n.gpu.name == g.name)
        node = max(n.count for n in cluster.nodes if n.gpu.name == g.name)
        ok = tuple(e for e in space.expert_parallel_options if model.num_experts % e == 0 and e <= count) or (1,)
        tps = valid_tps(model, cluster, g.name, space.tp_options)
        mid = sorted(tps)[(len(tps) - 1) // 2] if tps else 1
        eps[g.name] = ok
        main[g.name] = max((e for e in ok if e * mid <= node), default=min(ok))
    return ExpertDesign(model=model, cluster=cluster, eps=eps, main=main, everywhere=mode == "all")


def with_experts(points: list[dict[str, Any]], design: ExpertDesign | None) -> list[dict[str, Any]]:
    """The points with their MoE columns (`ExpertDesign.columns`); unchanged for a dense model."""
    if design is None:
        return points
    return [{**p, **design.columns(p)} if design.everywhere or "expert_parallel" in p else p for p in points]


def fits(design: ExpertDesign, gpu: str, tp: int, ep: int) -> bool:
    """Whether an ep group of tp-GPU stages fits on the cluster's GPUs of that type."""
    return ep * tp <= sum(n.count for n in design.cluster.nodes if n.gpu.name == gpu)


def expert_peak_delta(design: ExpertDesign, sigs: Any, ep: int | None = None) -> np.ndarray:
    """MiB a MoE stage's peak adds to its dense equivalent's at `ep` (the design's at each row's tp when None;
    memx.planner.moe.adjust, memory only): used to place points (`memx.profiling.design.fitting_layers`), never as
    a measurement."""
    cols = {c: sigs[c].to_numpy() for c in sigs.columns}
    n = len(sigs)
    eps = np.array([ep or design.ep_for(g, int(t)) for g, t in zip(sigs["gpu"], sigs["tp"])], dtype=np.float64)
    cols.update(expert_parallel=eps, expert_dp=np.ones(n), a2a_gbps=np.zeros(n),
                a2a_latency_ms=np.zeros(n))
    zero = {"peak_mem_mib": np.zeros(n), "static_mem_mib": np.zeros(n)}
    return moe.adjust(zero, cols, design.model, None)["peak_mem_mib"]
