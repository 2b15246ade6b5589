"""Profile importers (memx.profiling.importers) on small hand-written files in each tool's format."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from memx.domain.errors import InputError
from memx.domain.records import STAGE_RUN_COLUMNS
from memx.domain.specs import ModelArch
from memx.profiling.importers import EXTRA_COLUMNS, FORMATS, backward_forward_ratios, import_profiles

TINY = ModelArch(name="tiny", layers=2, hidden=64, ffn_hidden=256, heads=4, query_groups=4, vocab=1000,
                 seq_len=128, mlp="gelu")


def sailor_file(root, gpu="A100-40", entries=None):
    path = root / "tiny" / gpu / "profile.json"
    path.parent.mkdir(parents=True)
    entries = entries or {"0": [0.001, 0.000002, 0.5], "1": [0.003, 0.006, 0.5], "2": [0.002, 0.005, 0.5],
                          "3": [0.004, 0.004, 0.5]}
    path.write_text(json.dumps({"2": {"1": entries}}))
    return path


def test_sailor_rows_units_and_composition(tmp_path):
    r = import_profiles("sailor", sailor_file(tmp_path), model=TINY)
    df = r.frame.set_index(["layers", "first", "last"])
    assert list(r.frame.columns) == list(STAGE_RUN_COLUMNS) and set(EXTRA_COLUMNS) <= set(STAGE_RUN_COLUMNS) and not r.rejects
    assert set(r.frame.gpu) == {"a100-40g"} and set(r.frame.phase) == {"forward_backward"}
    assert df.loc[(0, True, False), "time_ms"] == pytest.approx(1.002)  # seconds → ms, fwd + bwd
    one = df.loc[(1, False, False)]  # the median layer entry: layer 1 (9 ms) and layer 2 (7 ms) → 9 ms
    assert (one.time_ms, one.forward_ms, one.backward_ms) == pytest.approx((9.0, 3.0, 6.0))
    assert df.loc[(0, False, True), "time_ms"] == pytest.approx(8.0)
    assert r.frame.peak_mem_mib.isna().all() and (r.frame.micro_batch == 2).all() and (r.frame.seq_len == 128).all()
    assert r.frame.source.iloc[0] == "records:sailor/tiny/A100-40/profile.json"


def test_sailor_llama_final_norm_is_part_of_the_output_row(tmp_path):
    entries = {str(i): [0.001, 0.001, 0.0] for i in range(5)}  # embedding, 2 layers, final norm, head
    r = import_profiles("sailor", sailor_file(tmp_path, entries=entries), model=TINY)
    assert r.frame[r.frame["last"]].time_ms.iloc[0] == pytest.approx(4.0)


def test_gpu_mapping_and_override(tmp_path):
    path = sailor_file(tmp_path, gpu="B200-192")
    with pytest.raises(InputError, match="B200-192.*known: A100-40.*--gpu"):
        import_profiles("sailor", path, model=TINY)
    assert set(import_profiles("sailor", path, model=TINY, gpu="b200-192g").frame.gpu) == {"b200-192g"}


@pytest.mark.parametrize("entries, match", [
    ({"0": [1, 1, 1], "1": [1, 1, 1]}, "2 layer entries.*expected 4"),
    ({"0": [0.1, 0.1], "1": [1, 1, 1], "2": [1, 1, 1], "3": [1, 1, 1]}, r"\[0\].*expected \[fwd_s, bwd_s"),
    ({"0": [-1, 0, 0], "1": [1, 1, 1], "2": [1, 1, 1], "3": [1, 1, 1]}, "number ≥ 0"),
    ({"0": [5000, 0, 0], "1": [1, 1, 1], "2": [1, 1, 1], "3": [1, 1, 1]}, "implausible"),
])
def test_sailor_bad_files_name_file_and_entry(tmp_path, entries, match):
    with pytest.raises(InputError, match=match):
        import_profiles("sailor", sailor_file(tmp_path, entries=entries), model=TINY)


def metis_doc(**time_extra):
    return {"model": {"model_name": "tiny", "num_layers": 4, "parameters": {}},
            "execution_time": {"total_time_ms": 0, "forward_backward_time_ms": 0, "batch_generator_time_ms": 0,
                               "optimizer_time_ms": 0, "layer_compute_total_ms": [0.2, 7.0, 6.0, 7.5],
                               **time_extra},
            "execution_memory": {"layer_memory_total_mb": [1, 2, 3, 4]}}


def test_metis_ms_and_unknown_keys(tmp_path):
    path = tmp_path / "tiny" / "V100-16" / "mbs4_tmp2.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(metis_doc()))
    df = import_profiles("metis", tmp_path, model=TINY).frame
    assert (df.tp == 2).all() and (df.micro_batch == 4).all() and set(df.gpu) == {"v100-16g"}
    assert sorted(df.time_ms) == pytest.approx([0.2, 7.0, 7.5]) and df.forward_ms.isna().all()
    path.write_text(json.dumps(metis_doc(layer_compute_total_us=[1.0])))
    with pytest.raises(InputError, match="unknown key 'layer_compute_total_us'; known: total_time_ms"):
        import_profiles("metis", path, model=TINY)
    bad = path.with_name("mbs4.json")
    bad.write_text(json.dumps(metis_doc()))
    with pytest.raises(InputError, match="mbs<B>_tmp<T>"):
        import_profiles("metis", bad, model=TINY)


def aceso_csv(tmp_path, body, header="mbs,tp,algo,fwd,bwd,fwd+bwd"):
    path = tmp_path / "GH-96.csv"
    path.write_text(header + "\n" + body)
    return path


def test_aceso_rows_skip_algo_1_and_reject_inconsistent_sums(tmp_path):
    path = aceso_csv(tmp_path, "1,1,0,0.001854,0.002464,0.004317\n1,1,1,0.0019,0.0025,0.0044\n"
                               "2,1,0,0.003,0.004,0.009\n")
    r = import_profiles("aceso", path, model=TINY)
    assert len(r.frame) == 1 and r.frame.gpu.iloc[0] == "gh200-96g" and (r.frame.layers == 1).all()
    assert (r.frame.forward_ms.iloc[0], r.frame.backward_ms.iloc[0]) == pytest.approx((1.854, 2.464))
    assert "algo 1" in r.skipped[0]
    assert [(x.row, x.column) for x in r.rejects] == [(2, "fwd+bwd")]


@pytest.mark.parametrize("header, body, match", [
    ("mbs,tp,algo,fwd_us,bwd,fwd+bwd", "1,1,0,1,1,2", "unknown column 'fwd_us'; known columns: mbs, tp"),
    ("mbs,tp,algo,fwd,bwd", "1,1,0,1,1", "column 'fwd\\+bwd' missing"),
    ("mbs,tp,algo,fwd,bwd,fwd+bwd", "1,1,2,1,1,2", "algo '2'; known: 0"),
])
def test_aceso_bad_files(tmp_path, header, body, match):
    with pytest.raises(InputError, match=match):
        import_profiles("aceso", aceso_csv(tmp_path, body, header), model=TINY)


def test_galvatron_forward_rows_need_gpu(tmp_path):
    comp = tmp_path / "computation_profiling_bf16_tiny_all.json"
    comp.write_text(json.dumps({"layernum[2]_bsz1_seq512": 15.0, "layernum[4]_bsz1_seq512": 24.0,
                                "layertype_0_bsz1_seq512": 4.5, "layertype_other_bsz1_seq512": 6.0}))
    (tmp_path / "memory_profiling_bf16_tiny_all.json").write_text(json.dumps({"1_1_8_sp": {}}))
    with pytest.raises(InputError, match="do not name the GPU type; give --gpu"):
        import_profiles("galvatron", tmp_path, model=TINY)
    r = import_profiles("galvatron", tmp_path, model=TINY, gpu="a100-80g")
    assert sorted(zip(r.frame.layers, r.frame.time_ms)) == [(2, 15.0), (4, 24.0)]
    assert set(r.frame.phase) == {"forward"} and r.frame.backward_ms.isna().all()
    assert r.frame["first"].all() and r.frame["last"].all() and (r.frame.seq_len == 512).all()
    assert len(r.skipped) == 2 and "derived" in r.skipped[0] and "memory profile" in r.skipped[1]
    comp.write_text(json.dumps({"layernum[2]_bsz1_seq512_us": 15.0}))
    with pytest.raises(InputError, match="unknown key 'layernum\\[2\\]_bsz1_seq512_us'"):
        import_profiles("galvatron", comp, model=TINY, gpu="a100-80g")


def test_unknown_format_and_missing_path(tmp_path):
    with pytest.raises(InputError, match="known: sailor, metis, aceso, galvatron"):
        import_profiles("piper", tmp_path, model=TINY)
    with pytest.raises(InputError, match="no such file or folder"):
        import_profiles("sailor", tmp_path / "nope", model=TINY)
    with pytest.raises(InputError, match="no sailor profile files"):
        import_profiles("sailor", tmp_path, model=TINY)
    assert set(FORMATS) == {"sailor", "metis", "aceso", "galvatron"}


def test_backward_forward_ratios_and_summary(tmp_path):
    r = import_profiles("sailor", sailor_file(tmp_path), model=TINY)
    ratios = backward_forward_ratios(r.frame)
    assert list(ratios.gpu) == ["a100-40g"] and ratios["median"].iloc[0] == pytest.approx(2.0)
    assert "3 rows from 1 file(s) (phase: forward_backward 3; gpu: a100-40g 3)" in r.summary()
    assert isinstance(r.frame.micro_batches.dtype, pd.Int64Dtype)
