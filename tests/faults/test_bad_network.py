"""Bad network input in cluster catalogs (issue #23, network; issue #25, `repeat:`): per-node NIC
bandwidth and latency, NICs for GPU counts a node does not have, cross-vendor links, bad `repeat`.
Each case: InputError (exit 2), one line naming the file, the field and the allowed values; nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from memx.domain.catalog import load_cluster
from memx.domain.errors import InputError

BASE = "name: c\ninter_node_bandwidth_gbps: 25\n{extra}nodes:\n  - {{gpu: a100-80g, count: 8{node}}}\n"

CASES = [  # (id, node fields, cluster fields, what the message must name)
    ("nic-bandwidth-zero", ", nic_bandwidth_gbps: 0", "", ("nodes.0.nic_bandwidth_gbps", "greater than 0")),
    ("nic-bandwidth-negative", ", nic_bandwidth_gbps: -5", "", ("nodes.0.nic_bandwidth_gbps", "greater than 0")),
    ("nic-bandwidth-inf", ", nic_bandwidth_gbps: .inf", "", ("nodes.0.nic_bandwidth_gbps", "finite")),
    ("nic-bandwidth-nan", ", nic_bandwidth_gbps: .nan", "", ("nodes.0.nic_bandwidth_gbps",)),
    ("nic-bandwidth-over-bound", ", nic_bandwidth_gbps: 1.0e+9", "", ("nodes.0.nic_bandwidth_gbps", "1000000")),
    ("nic-bandwidth-text", ", nic_bandwidth_gbps: fast", "", ("nodes.0.nic_bandwidth_gbps", "number")),
    ("nic-latency-zero", ", nic_latency_ms: 0", "", ("nodes.0.nic_latency_ms", "greater than 0")),
    ("nic-latency-negative", ", nic_latency_ms: -0.01", "", ("nodes.0.nic_latency_ms", "greater than 0")),
    ("nic-latency-inf", ", nic_latency_ms: .inf", "", ("nodes.0.nic_latency_ms", "finite")),
    ("nic-for-16-gpus-on-8", ", gpus_per_nic: 16", "", ("nodes.0.gpus_per_nic", "1, 2, 4, 8")),
    ("nic-for-3-gpus-on-8", ", gpus_per_nic: 3", "", ("nodes.0.gpus_per_nic", "1, 2, 4, 8")),
    ("nic-for-0-gpus", ", gpus_per_nic: 0", "", ("nodes.0.gpus_per_nic", "greater than 0")),
    ("cross-vendor-bandwidth-zero", "", "cross_vendor_bandwidth_gbps: 0\n", ("cross_vendor_bandwidth_gbps", "greater than 0")),
    ("cross-vendor-bandwidth-nan", "", "cross_vendor_bandwidth_gbps: .nan\n", ("cross_vendor_bandwidth_gbps",)),
    ("cross-vendor-latency-negative", "", "cross_vendor_latency_ms: -1\n", ("cross_vendor_latency_ms", "greater than 0")),
    ("cross-vendor-latency-inf", "", "cross_vendor_latency_ms: .inf\n", ("cross_vendor_latency_ms", "finite")),
    ("repeat-zero", ", repeat: 0", "", ("nodes.0.repeat", "1 to 65536")),
    ("repeat-negative", ", repeat: -3", "", ("nodes.0.repeat", "1 to 65536")),
    ("repeat-fraction", ", repeat: 2.5", "", ("nodes.0.repeat", "1 to 65536")),
    ("repeat-text", ", repeat: many", "", ("nodes.0.repeat", "1 to 65536")),
    ("repeat-bool", ", repeat: true", "", ("nodes.0.repeat", "1 to 65536")),
    ("repeat-1e20", ", repeat: 100000000000000000000", "", ("nodes.0.repeat", "1 to 65536")),
    ("repeat-over-65536-gpus", ", repeat: 9000", "", ("'nodes'", "65536", "repeat")),
]


@pytest.mark.parametrize("node,extra,names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_network_input(tmp_path: Path, node: str, extra: str, names: tuple[str, ...]) -> None:
    src = tmp_path / "in" / "c.yaml"
    src.parent.mkdir()
    src.write_text(BASE.format(extra=extra, node=node))
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(InputError) as err:
        load_cluster(src)
    msg = str(err.value)
    assert err.value.exit_code == 2 and "\n" not in msg and str(src) in msg, msg
    for name in names:
        assert name in msg, (name, msg)
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_repeat_expands_in_place(tmp_path: Path) -> None:
    """`repeat: N` is N identical entries where it stands; NIC fields are kept on each copy."""
    src = tmp_path / "c.yaml"
    src.write_text("name: c\ninter_node_bandwidth_gbps: 25\nnodes:\n  - {gpu: a100-80g, count: 4}\n"
                   "  - {gpu: v100-16g, count: 2, repeat: 3, nic_bandwidth_gbps: 1.25, gpus_per_nic: 1}\n"
                   "  - {gpu: a100-80g, count: 4}\n")
    c = load_cluster(src)
    assert [n.gpu.name for n in c.nodes] == ["a100-80g", *["v100-16g"] * 3, "a100-80g"]
    assert [c.nic_gbps(i) for i in range(5)] == [25, 1.25, 1.25, 1.25, 25] and c.nodes[2].nics == 2
