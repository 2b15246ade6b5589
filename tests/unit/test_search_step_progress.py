"""memx.pipeline.steps.compute_search passes `on_progress` to the search (pipeline-mode progress bar)."""

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.pipeline.steps import compute_search
from memx.planner.cost import AnalyticStageModel


def test_compute_search_reports_progress_to_the_end(conf_root):
    cluster, model = load_cluster("xy-2", conf_root), load_model("llama-6l", conf_root)
    space = load_search("small", conf_root)
    calls: list[tuple[int, int]] = []
    result = compute_search(AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}), cluster, model, space,
                            weights=None, top_k=3, predictor_name="analytic",
                            on_progress=lambda done, total: calls.append((done, total)))
    assert len(calls) >= 2 and all(0 <= d <= t for d, t in calls)
    assert calls[-1][0] == calls[-1][1] > 0  # done == total at the end
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)  # never goes backwards
    assert len(result.tables["top"]) >= 1 and result.manifest["evaluated"] > 0
