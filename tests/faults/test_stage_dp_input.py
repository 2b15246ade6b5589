"""Bad per-stage data-parallel input (issue #27), through `memx simulate plan`: exit 2, one line naming every
factor that does not fit, nothing written. Table-driven: (case id, plan changes, names the message must hold)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bad_plans import assert_rejected

BASE = {"model": "llama2-7b", "cluster": "a100-v100-16", "global_batch": 64, "micro_batch": 1, "seq_len": 4096,
        "dp": 2, "precision": "fp16",
        "stages": [{"gpu": "a100-80g", "tp": 2, "layers": 12, "recompute": "none", "data_parallel": 2},
                   {"gpu": "v100-32g", "tp": 4, "layers": 10, "recompute": "full", "data_parallel": 1},
                   {"gpu": "v100-32g", "tp": 4, "layers": 10, "recompute": "full", "data_parallel": 2}]}


def _dps(*dps):
    return [dict(s, data_parallel=d) for s, d in zip(BASE["stages"], dps)]


CASES = [
    ("dp-does-not-divide-samples", {"stages": _dps(2, 3, 2)}, ("stages[1].data_parallel (3)", "2 samples")),
    ("first-stage-not-the-jobs-dp", {"stages": _dps(1, 1, 2)}, ("stages[0].data_parallel (1)", "'dp' (2)")),
    ("more-gpus-than-the-cluster", {"micro_batch": 2, "stages": _dps(2, 4, 1)}, ("20 × v100-32g", "Σ tp_i × dp_i", "has 12")),
    ("every-factor-at-once", {"micro_batch": 2, "stages": _dps(1, 3, 8)},
     ("stages[0].data_parallel (1)", "stages[1].data_parallel (3)", "44 × v100-32g")),
    ("with-interleaving", {"virtual_stages": 2, "stages": [dict(s, layers=n) for s, n in zip(_dps(2, 1, 2), (12, 10, 10))]},
     ("'virtual_stages' (2)", "per-stage data_parallel")),
    ("with-context-parallel-that-does-not-fit", {"context_parallel": 3, "micro_batch": 2, "stages": _dps(2, 1, 1)},
     ("'seq_len' (4096) is not divisible by context_parallel (3)", "2 × context_parallel (6)",
      "12 × a100-80g (Σ tp_i × dp_i × cp)", "24 × v100-32g")),
    ("expert-parallel-that-does-not-divide-a-stage", {"model": "qwen1.5-moe-a2.7b", "expert_parallel": 2,
                                                      "sequence_parallel": True,
                                                      "stages": [dict(s, layers=n) for s, n in zip(_dps(2, 1, 2), (8, 8, 8))]},
     ("field 'expert_parallel' (2) does not divide stages[1].data_parallel × context_parallel (1 × 1)",
      "expert tp (= tp) × ep × expert dp")),
    ("tied-embeddings-ends-do-not-divide", {"model": "gpt2-1024", "seq_len": 1024, "micro_batch": 3, "global_batch": 48,
                                            "distributed_optimizer": True,
                                            "stages": [dict(s, layers=n, tp=2) for s, n in zip(_dps(2, 1, 3), (8, 8, 8))]},
     ("tied embeddings", "(2, 3)")),
    ("expert-parallel-per-stage-one-and-not", {"model": "qwen1.5-moe-a2.7b", "expert_parallel": 2,
                                               "sequence_parallel": True,
                                               "stages": [dict(s, layers=8, data_parallel=d, expert_parallel=e)
                                                          for s, d, e in zip(BASE["stages"], (2, 1, 2), (2, 1, 2))]},
     ("expert_parallel per stage [2, 1, 2]", "every stage's must be 1 or none may be")),
    ("expert-parallel-on-a-stage-without-a-per-stage-dp", {"model": "qwen1.5-moe-a2.7b", "sequence_parallel": True,
                                                          "stages": [dict(s, layers=8, data_parallel=2, expert_parallel=e)
                                                                     for s, e in zip(BASE["stages"], (1, 2, 2))]},
     ("stages[1, 2].expert_parallel differ from field 'expert_parallel' (1)", "a per-stage ep needs")),
    ("zero", {"stages": _dps(2, 0, 2)}, ("stages[1]", "'data_parallel'", "≥ 1")),
    ("not-an-integer", {"stages": _dps(2, "1", 2)}, ("stages[1]", "'data_parallel'")),
]


@pytest.mark.parametrize("changes,names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_stage_dp_exits_2_naming_each_factor(changes, names, tmp_path):
    assert_rejected({**BASE, **changes}, names, tmp_path)


def test_replica_group_stage_may_not_carry_its_own_dp(tmp_path):
    grouped = {"schema": 2, "model": "llama2-7b", "cluster": "a100-v100-16", "global_batch": 16, "seq_len": 4096,
               "precision": "fp16",
               "groups": [{"dp": 1, "micro_batch": 1, "micro_batches": 16,
                           "stages": [{"gpu": "a100-80g", "tp": 4, "layers": 32, "data_parallel": 1}]}]}
    assert_rejected(grouped, ("groups[0]", "'data_parallel'", "one 'dp'"), tmp_path)
    grouped["groups"][0]["stages"][0] = {"gpu": "a100-80g", "tp": 4, "layers": 32, "expert_parallel": 2}
    assert_rejected(grouped, ("groups[0]", "'expert_parallel'", "no expert parallelism"), tmp_path)


@pytest.mark.parametrize("raw,names", [
    ({"stage_data_parallel": True, "launcher": "megatron"}, ("stage_data_parallel", "megatron", "one --data-parallel")),
    ({"stage_data_parallel": "maybe"}, ("stage_data_parallel",)),
], ids=["with-megatron", "not-a-boolean"])
def test_bad_search_option_names_the_field(raw, names, tmp_path):
    import yaml

    from memx.domain.catalog import load_search
    from memx.domain.errors import InputError

    path = tmp_path / "s.yaml"
    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "conf" / "search" / "default.yaml").read_text())
    path.write_text(yaml.safe_dump({**data, **raw}))
    with pytest.raises(InputError) as exc:
        load_search(str(path))
    text = str(exc.value)
    assert "\n" not in text.strip() and "s.yaml" in text and all(n in text for n in names), text
