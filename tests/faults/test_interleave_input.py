"""Bad interleaved-1F1B input (issue #27), through `memx simulate plan`: exit 2, one line naming every factor
that does not divide, nothing written. Table-driven: (case id, plan changes, names the message must hold)."""

from __future__ import annotations

import pytest

from tests.support.bad_plans import assert_rejected

BASE = {"model": "llama2-7b", "cluster": "three-vendor-20", "global_batch": 48, "micro_batch": 1, "seq_len": 4096,
        "dp": 2, "stages": [{"gpu": "a100-80g", "tp": 2, "layers": 8, "recompute": "selective"},
                            {"gpu": "vendor-b-32g", "tp": 4, "layers": 12, "recompute": "full"},
                            {"gpu": "vendor-c-32g", "tp": 4, "layers": 12, "recompute": "full"}]}


def _stages(*layers, rl=None):
    out = [dict(s, layers=n) for s, n in zip(BASE["stages"], layers)]
    if rl is not None:
        out[1] = dict(out[1], recompute_layers=rl)
    return out


CASES = [
    ("layers-not-divisible", {"virtual_stages": 3, "stages": _stages(8, 12, 12)}, ("stages[0].layers (8)", "(3)")),
    ("two-stages-not-divisible", {"virtual_stages": 4, "stages": _stages(6, 14, 12)},
     ("stages[0].layers (6)", "stages[1].layers (14)")),
    ("micro-batches-not-multiple-of-pp", {"virtual_stages": 2, "global_batch": 40}, ("micro batches", "(20)", "pp (3)")),
    ("every-factor-at-once", {"virtual_stages": 2, "global_batch": 40, "stages": _stages(9, 11, 12)},
     ("stages[0].layers (9)", "stages[1].layers (11)", "micro batches")),
    ("block-recompute-not-divisible", {"virtual_stages": 2, "stages": _stages(8, 12, 12, rl=3)},
     ("stages[1].recompute_layers (3)",)),
    ("one-stage", {"virtual_stages": 2, "dp": 1, "global_batch": 8,
                   "stages": [{"gpu": "a100-80g", "tp": 4, "layers": 32}]}, ("needs pp > 1",)),
    ("zero", {"virtual_stages": 0}, ("'virtual_stages'", "≥ 1")),
    ("not-an-integer", {"virtual_stages": "2"}, ("'virtual_stages'",)),
]


@pytest.mark.parametrize("changes,names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_interleaving_exits_2_naming_each_factor(changes, names, tmp_path):
    assert_rejected({**BASE, **changes}, names, tmp_path)
