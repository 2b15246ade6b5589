"""Cluster changes: add a node to a cluster catalog and tell Prefect (`memx.cluster.changed`).

The event's resource id is `memx.cluster.<name>`; its payload names the cluster, the GPU type and
count added, whether that GPU type was new to the cluster, the changed file and its catalog folder, and
the model and search space to re-plan (`memx cluster add-node --model --search`). The `reprofile-on-hardware`
deployment (prefect.yaml) triggers on it. An inventory system can emit the same event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from memx.domain.catalog import load_cluster, load_gpu, packaged_conf_root, resolve
from memx.domain.errors import InputError, short_repr
from memx.domain.home import home_path
from memx.domain.io import atomic_write_text
from memx.domain.specs import MAX_CLUSTER_GPUS, MAX_GPUS_PER_NODE

EVENT = "memx.cluster.changed"


@dataclass(frozen=True, kw_only=True)
class NodeAdded:
    cluster: str
    path: Path
    gpu: str
    count: int
    new_gpu_type: bool


def add_node(cluster: str, gpu: str, count: int, conf_root: Path | None = None) -> NodeAdded:
    """Append `{gpu, count}` to the cluster's nodes after validating both, keeping the file's comments.

    A cluster from the packaged conf/ is never changed in place: the changed copy goes to the user's
    catalog (`conf_root`, else $MEMX_HOME/conf), whose entries win over the packaged ones
    (memx.domain.catalog.catalog_roots). A user's own file is changed in place (atomically)."""
    if not 1 <= count <= MAX_GPUS_PER_NODE:  # checked before anything is written (memx.domain.specs bounds)
        raise InputError(f"--count must be in 1..{MAX_GPUS_PER_NODE} (GPUs in one node), got {short_repr(count)}")
    src = resolve("clusters", cluster, conf_root)
    load_gpu(gpu, conf_root)  # unknown GPU → InputError listing the known ones
    before = load_cluster(src, conf_root)
    if before.total_gpus + count > MAX_CLUSTER_GPUS:
        raise InputError(f"--count {count}: cluster {before.name} would hold {before.total_gpus + count} GPUs; "
                         f"at most {MAX_CLUSTER_GPUS}")
    text = with_node(src.read_text(encoding="utf-8"), gpu, count, src)
    dest = src
    if src.resolve().is_relative_to(packaged_conf_root().resolve()):
        dest = (Path(conf_root) if conf_root is not None else home_path("conf")) / "clusters" / src.name
    atomic_write_text(dest, text)
    load_cluster(dest, conf_root)  # still valid
    return NodeAdded(cluster=before.name, path=dest, gpu=gpu, count=count,
                     new_gpu_type=gpu not in {g.name for g in before.gpu_types})


def with_node(text: str, gpu: str, count: int, source: Path) -> str:
    """The cluster YAML with one more node, by a line edit after the last item of its block list `nodes:`
    (comments and layout kept; the new item copies the first item's indentation and flow/block style)."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if re.match(r"nodes:\s*(#.*)?$", ln.rstrip("\n"))), None)
    if start is None:
        raise InputError(f"{source}: field 'nodes' is not a block list (`nodes:` then one `- ...` item per line); "
                         "add the node by hand")
    end, first = start, None
    for i in range(start + 1, len(lines)):
        body = lines[i].strip()
        if body and not body.startswith("#") and not lines[i][0] in " -\t":
            break  # the next top-level key
        if body and not body.startswith("#"):
            end = i
            if first is None and body.startswith("-"):
                first = lines[i]
    if first is None:
        raise InputError(f"{source}: field 'nodes' has no items to follow; add the node by hand")
    indent = first[:first.index("-")]
    item = (f"{indent}- {{gpu: {gpu}, count: {count}}}\n" if first.strip()[1:].lstrip().startswith("{")
            else f"{indent}- gpu: {gpu}\n{indent}  count: {count}\n")
    if not lines[end].endswith("\n"):
        lines[end] += "\n"
    out = "".join([*lines[:end + 1], item, *lines[end + 1:]])
    if yaml.safe_load(out).get("nodes", [])[-1:] != [{"gpu": gpu, "count": count}]:  # the edit did what it says
        raise InputError(f"{source}: could not append a node by a line edit; add the node by hand")
    return out


def event_payload(change: NodeAdded, model: str, search: str) -> dict[str, Any]:
    """What the `reprofile-on-hardware` deployment needs to run the pipeline (prefect.yaml): the changed
    cluster file (a path is a valid --cluster), the catalog folder it lives in (its GPU types), the model
    and search space to plan."""
    folder = change.path.parent
    conf = folder.parent if folder.name == "clusters" else folder
    return {"cluster": change.cluster, "gpu": change.gpu, "count": change.count, "new_gpu_type": change.new_gpu_type,
            "path": str(change.path), "conf": str(conf.absolute()), "model": model, "search": search}


def emit_cluster_changed(change: NodeAdded, model: str, search: str) -> bool:
    """Emit the event to the Prefect API in use; False when no Prefect server is configured
    (PREFECT_API_URL unset: a temporary server would vanish with the event)."""
    from prefect.events import emit_event
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        return False

    ev = emit_event(event=EVENT, resource={"prefect.resource.id": f"memx.cluster.{change.cluster}"},
                    payload=event_payload(change, model, search))
    return ev is not None
