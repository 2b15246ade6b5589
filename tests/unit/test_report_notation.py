"""Compact stage notation: runs of equal stages, `GPU×tp [layers] recompute`, joined by →."""

from memx.report.notation import compact_stages, recompute_label


def st(gpu, tp, layers, recompute="none", n=None):
    d = {"gpu": gpu, "tp": tp, "layers": layers, "recompute": recompute}
    return d if n is None else {**d, "recompute_layers": n}


def test_runs_of_equal_stages():
    plan = {"stages": [st("a100-80g", 2, 1), st("vendor-b-32g", 2, 3, "selective"), st("vendor-b-32g", 2, 3, "selective"),
                       st("vendor-b-32g", 2, 3, "selective"), st("vendor-b-32g", 2, 3, "selective"),
                       st("vendor-c-32g", 4, 2, "full", 1), st("vendor-c-32g", 4, 2, "full", 1)]}
    assert compact_stages(plan) == "a100-80g×2 [1] → vendor-b-32g×2 [3,3,3,3] sel → vendor-c-32g×4 [2,2] full:1"


def test_a_run_breaks_on_gpu_tp_or_recompute_but_not_on_layers():
    plan = {"stages": [st("v100-32g", 1, 4), st("v100-32g", 1, 5), st("v100-32g", 2, 5), st("v100-32g", 2, 5, "full"),
                       st("v100-32g", 2, 5, "full", 2), st("v100-16g", 2, 5, "full", 2)]}
    assert compact_stages(plan) == ("v100-32g×1 [4,5] → v100-32g×2 [5] → v100-32g×2 [5] full → v100-32g×2 [5] full:2 "
                                    "→ v100-16g×2 [5] full:2")


def test_never_a_pipe_and_one_run_per_change():
    plan = {"stages": [st(f"gpu-{i % 2}", 1, 1) for i in range(7)]}
    text = compact_stages(plan)
    assert "|" not in text and text.count("→") == 6


def test_recompute_labels():
    assert [recompute_label(s) for s in (st("g", 1, 1), st("g", 1, 1, "selective"), st("g", 1, 1, "full"),
                                         st("g", 1, 1, "full", 3))] == ["", "sel", "full", "full:3"]
