"""Galvatron's published LLaMA2-7B profiles (../shared/realdata/galvatron) through
memx.profiling.importers: the computation profiles import as forward-only rows with zero rejects,
the values match the raw files (ms), the derived and memory entries are said and skipped, and the
GPU type must be given (the files do not name it)."""

from __future__ import annotations

import pytest

from memx.domain.errors import InputError
from memx.domain.specs import ModelArch
from memx.profiling.importers import import_profiles

LLAMA2_7B = ModelArch(name="llama2-7b", layers=32, hidden=4096, ffn_hidden=11008, heads=32, query_groups=32,
                      vocab=32000, seq_len=4096, mlp="swiglu")  # conf/models/llama2-7b.yaml


def test_galvatron_profiles_import(realdata):
    root = realdata / "galvatron"
    with pytest.raises(InputError, match="--gpu"):
        import_profiles("galvatron", root, model=LLAMA2_7B)
    r = import_profiles("galvatron", root, model=LLAMA2_7B, gpu="a100-80g")
    df = r.frame
    assert not r.rejects and len(r.files) == 4 and len(df) == 25  # 24 + 1 layernum keys
    assert set(df.phase) == {"forward"} and df.backward_ms.isna().all() and df.peak_mem_mib.isna().all()
    assert df["first"].all() and df["last"].all() and (df.tp == 1).all() and (df.seq_len == 2048).all()
    assert set(df.layers) == {2, 4} and set(df.micro_batch) == set(range(1, 13))
    # computation_profiling_bf16_llama2-7b_all.json: "layernum[2]_bsz1_seq2048": 15.0786208152771,
    # "layernum[4]_bsz12_seq2048": 223.25952301025393 — ms
    all_file = df[df.source == "records:galvatron/computation_profiling_bf16_llama2-7b_all.json"]
    t = dict(zip(zip(all_file.layers, all_file.micro_batch), all_file.time_ms))
    assert t[(2, 1)] == pytest.approx(15.0786208) and t[(4, 12)] == pytest.approx(223.2595230)
    # Galvatron's derived per-layer time per sample, (T[4] − T[2]) / 2 / bsz, follows from the rows
    assert (t[(4, 1)] - t[(2, 1)]) / 2 == pytest.approx(4.396252679824831)
    said = "\n".join(r.skipped)
    assert "24 derived key(s)" in said and said.count("memory profile") == 2
