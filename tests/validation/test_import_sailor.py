"""Sailor's published profiles (../shared/realdata/sailor: profiles_sailor, profiles_metis_format,
profiles_aceso_layer_time) through memx.profiling.importers: every file imports with zero rejected
rows, a few values checked against the raw files by hand, the backward/forward ratios per GPU type,
and the imported GH200 time-only rows composed into Sailor's 26 measured Clariden plans.

Composition (honest and simple; docs/importers.md §End-to-end check): stage time of one micro batch =
layers × the imported 1-layer row + the embedding row on the first stage + the output row on the last
(tp 4, the plan's micro batch), then MemX's own assembly (`estimate_plans`: 1F1B, p2p at 25 GB/s,
DP all-reduce, optimizer step from the closed-form static memory). No fitted parameter.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_predictor_sailor import GH200, MODELS, sailor_plans  # the same 26 plans and GH200 spec

from memx.domain.errors import InputError
from memx.domain.specs import ModelArch
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.profiling.importers import backward_forward_ratios, import_profiles

ARCH = {  # the models Sailor profiled; LLaMA-3-8B and OPT-30B from their public model cards
    **MODELS,
    "LLAMA-3-8": ModelArch(name="LLAMA-3-8", layers=32, hidden=4096, ffn_hidden=14336, heads=32, query_groups=8,
                           vocab=128256, seq_len=2048, mlp="swiglu"),
    "OPT-30": ModelArch(name="OPT-30", layers=48, hidden=7168, ffn_hidden=28672, heads=56, query_groups=56,
                        vocab=50272, seq_len=2048, mlp="gelu"),
}
FOLDERS = {"sailor": "profiles_sailor", "metis": "profiles_metis_format"}
# Sailor's GPT-Neo-2.7/GH-96/profile.json has 26 entries (a 24-layer model) and OPT-350/GH-96's numbers:
# a published copy, not a GPT-Neo profile. The importer refuses it; the Metis-format GH-96 files are real.
DEFECT = ("sailor", "GPT-Neo-2.7", "GH-96")


def points(fmt, files) -> int:
    """(micro batch, tp) points in the raw files: each gives three rows (embedding, layer, output)."""
    if fmt == "metis":
        return len(files)
    return sum(len(by_tp) for f in files for by_tp in json.loads(Path(f).read_text()).values())


def folders(realdata, fmt):
    root = realdata / "sailor" / FOLDERS[fmt]
    return [(m.name, g) for m in sorted(root.iterdir()) for g in sorted(m.iterdir())]


@pytest.mark.parametrize("fmt", ["sailor", "metis"])
def test_every_per_layer_file_imports_without_rejects(realdata, fmt):
    n_rows = 0
    for model, gpu_dir in folders(realdata, fmt):
        if (fmt, model, gpu_dir.name) == DEFECT:
            with pytest.raises(InputError, match="26 layer entries.*32 transformer layers"):
                import_profiles(fmt, gpu_dir, model=ARCH[model])
            continue
        r = import_profiles(fmt, gpu_dir, model=ARCH[model])
        assert not r.rejects and len(r.frame) == 3 * points(fmt, r.files), (model, gpu_dir.name)
        assert r.frame.peak_mem_mib.isna().all() and set(r.frame.phase) == {"forward_backward"}
        n_rows += len(r.frame)
    assert n_rows > 300


def test_sailor_defect_is_a_copy_of_opt350(realdata):
    a = json.loads((realdata / "sailor/profiles_sailor/GPT-Neo-2.7/GH-96/profile.json").read_text())
    b = json.loads((realdata / "sailor/profiles_sailor/OPT-350/GH-96/profile.json").read_text())
    assert a["8"]["4"]["2"] == b["8"]["4"]["2"] and len(a["8"]["4"]) == 26


def one(df, **eq):
    sel = df
    for k, v in eq.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, eq
    return sel.iloc[0]


def test_spot_checks_against_the_raw_files(realdata):
    # profile.json OPT-350/GH-96 [8][4]: "0": [0.000922, 1e-06, …], "2": [0.002683, 0.00647, …],
    # "25": [0.004014, 0.005944, …] — seconds
    df = import_profiles("sailor", realdata / "sailor/profiles_sailor/OPT-350/GH-96", model=ARCH["OPT-350"]).frame
    layer = one(df, tp=4, micro_batch=8, layers=1)
    assert (layer.time_ms, layer.forward_ms, layer.backward_ms) == pytest.approx((9.153, 2.683, 6.47))
    assert one(df, tp=4, micro_batch=8, layers=0, first=True).time_ms == pytest.approx(0.923)
    assert one(df, tp=4, micro_batch=8, layers=0, last=True).time_ms == pytest.approx(9.958)
    # Metis OPT-350/GH-96/mbs2_tmp1.json: layer_compute_total_ms [0.211, 7.273, 6.983, …, 7.417] — ms
    df = import_profiles("metis", realdata / "sailor/profiles_metis_format/OPT-350/GH-96/mbs2_tmp1.json",
                         model=ARCH["OPT-350"]).frame
    assert sorted(df.time_ms) == pytest.approx([0.211, 6.983, 7.417])
    # Aceso GH-96.csv: "1,1,0,0.001854,0.002464,0.004317" — seconds
    r = import_profiles("aceso", realdata / "sailor/profiles_aceso_layer_time/GH-96.csv", model=ARCH["OPT-350"])
    row = one(r.frame, tp=1, micro_batch=1)
    assert (row.forward_ms, row.backward_ms, row.gpu) == (pytest.approx(1.854), pytest.approx(2.464), "gh200-96g")


def test_aceso_files_import_and_ratios(realdata):
    r = import_profiles("aceso", realdata / "sailor/profiles_aceso_layer_time", model=ARCH["OPT-350"])
    assert not r.rejects and len(r.frame) == 84 and len(r.skipped) == 6  # algo 1 rows: said, not imported
    sailor = pd.concat([import_profiles("sailor", d, model=ARCH[m]).frame for m, d in folders(realdata, "sailor")
                        if ("sailor", m, d.name) != DEFECT])
    for name, frame in (("sailor profile.json", sailor), ("aceso fp32", r.frame)):
        ratios = backward_forward_ratios(frame)
        print(f"\nbackward/forward, transformer layer, {name}:\n{ratios.round(2).to_string(index=False)}")
        assert ((ratios["median"] > 1.0) & (ratios["median"] < 3.5)).all()


class ImportedLayerTimes:
    """Stage time from imported rows: layers × 1-layer row + embedding (first) + output (last);
    memory and static memory from the closed form (the rows carry none)."""

    name = "imported-layer-times"

    def __init__(self, rows: pd.DataFrame):
        kind = np.where(rows["layers"] >= 1, "layer", np.where(rows["first"], "first", "last"))
        self.t = dict(zip(zip(rows["hidden"], rows["tp"], rows["micro_batch"], kind), rows["time_ms"]))
        self.analytic = AnalyticStageModel(gpus={GH200.name: GH200})

    def predict(self, sigs: pd.DataFrame) -> pd.DataFrame:
        out = self.analytic.predict(sigs).copy()
        out["time_ms"] = [
            n * self.t[(h, tp, b, "layer")] + (self.t[(h, tp, b, "first")] if f else 0.0)
            + (self.t[(h, tp, b, "last")] if la else 0.0)
            for h, tp, b, n, f, la in zip(sigs["hidden"], sigs["tp"], sigs["micro_batch"], sigs["layers"],
                                          sigs["first"], sigs["last"])]
        return out


def gh200_rows(realdata, opt_format: str) -> pd.DataFrame:
    """GH200 rows: OPT-350 from `opt_format`; GPT-Neo-2.7 from the Metis files (its profile.json is the defect)."""
    def rows(fmt, model):
        return import_profiles(fmt, realdata / "sailor" / FOLDERS[fmt] / model / "GH-96", model=ARCH[model]).frame

    return pd.concat([rows(opt_format, "OPT-350"), rows("metis", "GPT-Neo-2.7")], ignore_index=True)


@pytest.mark.parametrize("opt_format, bound", [("metis", 0.13), ("sailor", 0.17)])
def test_imported_gh200_rows_predict_sailor_plans(realdata, opt_format, bound):
    plans = sailor_plans(realdata)
    predictor = ImportedLayerTimes(gh200_rows(realdata, opt_format))
    pred = np.array([estimate_plans([p], c, m, predictor)[0].iteration_time_ms for p, c, m, _, _ in plans])
    meas = np.array([p[3] for p in plans])
    ape = np.abs(pred - meas) / meas
    by_model = {m: ape[[p[2].name == m for p in plans]].mean() for m in MODELS}
    print(f"\nSailor GH200 plans n={len(plans)}, OPT-350 rows from {opt_format}: time MAPE {ape.mean():.3f} "
          f"(max {ape.max():.3f}; " + ", ".join(f"{m} {v:.3f}" for m, v in by_model.items())
          + f"); predicted/measured median {np.median(pred / meas):.3f}")
    assert len(plans) == 26 and ape.mean() < bound
