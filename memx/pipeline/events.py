"""Cluster changes: add a node to a cluster catalog and tell Prefect (`memx.cluster.changed`).

The event's resource id is `memx.cluster.<name>`; its payload names the cluster, the GPU type and
count added, and whether that GPU type was new to the cluster. The `reprofile-on-hardware`
deployment (prefect.yaml) triggers on it. An inventory system can emit the same event.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from memx.domain.catalog import load_cluster, load_gpu, resolve
from memx.domain.errors import InputError
from memx.domain.io import atomic_write_text

EVENT = "memx.cluster.changed"


@dataclass(frozen=True, kw_only=True)
class NodeAdded:
    cluster: str
    path: Path
    gpu: str
    count: int
    new_gpu_type: bool


def add_node(cluster: str, gpu: str, count: int, conf_root: Path | None = None) -> NodeAdded:
    """Append `{gpu, count}` to the cluster YAML (atomically) after validating both."""
    if count < 1:
        raise InputError(f"--count must be ≥ 1, got {count}")
    path = resolve("clusters", cluster, conf_root)
    load_gpu(gpu, conf_root)  # unknown GPU → InputError listing the known ones
    before = load_cluster(path, conf_root)
    data = yaml.safe_load(path.read_text())
    data.setdefault("nodes", []).append({"gpu": gpu, "count": count})
    text = yaml.safe_dump(data, sort_keys=False)
    atomic_write_text(path, text)
    load_cluster(path, conf_root)  # still valid
    return NodeAdded(cluster=before.name, path=path, gpu=gpu, count=count,
                     new_gpu_type=gpu not in {g.name for g in before.gpu_types})


def event_payload(change: NodeAdded) -> dict[str, Any]:
    return {"cluster": change.cluster, "gpu": change.gpu, "count": change.count, "new_gpu_type": change.new_gpu_type,
            "path": str(change.path)}


def emit_cluster_changed(change: NodeAdded) -> bool:
    """Emit the event to the Prefect API in use; False when no Prefect server is configured
    (PREFECT_API_URL unset: a temporary server would vanish with the event)."""
    from prefect.events import emit_event
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        return False

    ev = emit_event(event=EVENT, resource={"prefect.resource.id": f"memx.cluster.{change.cluster}"},
                    payload=event_payload(change))
    return ev is not None
