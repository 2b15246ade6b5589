"""`simulated` backend: each point runs on the virtual cluster (memx.simulator.measure_stages).

The noise seed of a point is derived from the profile seed and the point's signature key, so a
result does not depend on the order, the parallelism or a resumed run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from memx.domain.records import signature_key
from memx.domain.specs import Cluster
from memx.simulator import load_traits, measure_stage_rows


@dataclass(frozen=True, kw_only=True)
class SimulatedBackend:
    cluster: Cluster
    seed: int = 0
    conf_root: Path | None = None
    name: str = "simulated"
    _traits: dict = field(default_factory=dict, repr=False, compare=False)

    def _traits_for(self, gpu: str):
        if gpu not in self._traits:
            self._traits[gpu] = load_traits(gpu, self.conf_root)
        return self._traits[gpu]

    def measure(self, point: Mapping[str, Any]) -> dict[str, Any]:
        seed = (self.seed * 1_000_003 + int(signature_key(point), 16)) % 2**63
        (row,) = measure_stage_rows([dict(point)], seed=seed, gpus=self.cluster, conf_root=self.conf_root,
                                    traits={point["gpu"]: self._traits_for(point["gpu"])},
                                    source=point.get("source", ""))
        return row
