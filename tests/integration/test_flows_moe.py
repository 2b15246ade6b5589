"""The Prefect pipeline (profile → augment → train → search) on a mixture-of-experts model (issue #27): the stored
profiles carry the MoE signature, the trained champion kept the expert structures, and the search plans with it."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
import yaml


@pytest.mark.slow
def test_pipeline_profiles_moe_layers_and_plans_with_them(prefect_api, tmp_path):
    from flows.pipeline import pipeline_flow
    from memx.domain.catalog import default_conf_root
    from memx.pipeline.store import store_from_uri

    conf = tmp_path / "conf"
    shutil.copytree(default_conf_root(), conf)
    model = yaml.safe_load((conf / "models" / "llama-6l.yaml").read_text())
    (conf / "models" / "moe-6l.yaml").write_text(yaml.safe_dump(
        {**model, "name": "moe-6l", "num_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden": 2048}))
    search = yaml.safe_load((conf / "search" / "small.yaml").read_text())
    (conf / "search" / "small-moe.yaml").write_text(yaml.safe_dump({**search, "name": "small-moe",
                                                                      "expert_parallel_options": [1, 2]}))
    store = str(tmp_path / "artifacts")
    out = pipeline_flow(cluster="three-vendor-20", model="moe-6l", search="small-moe", conf=str(conf), store=store,
                        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    st = store_from_uri(store)
    profiles = st.list_versions("profile")
    runs = pd.concat([st.get_table("profile", r.version, "stage_runs") for r in profiles], ignore_index=True)
    moe_rows = runs[runs["num_experts"] == 4]  # the dense design plus MoE points (moe_layers "points")
    assert len(moe_rows) and set(moe_rows["expert_parallel"]) >= {1, 2}
    assert sum(s["layers"] for s in out["plan"]["stages"]) == 6
