"""`memx plan`: output contracts, files written, and exit codes for bad input / no feasible plan."""

import json

import pytest

from typer.testing import CliRunner

from memx.cli.app import app
runner = CliRunner()
SMALL = ["--model", "llama-6l", "--search", "small"]


def test_json_contract():
    res = runner.invoke(app, ["plan", *SMALL, "--format", "json", "--top", "3"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out) >= {"plan", "predicted", "weights", "space", "search_s", "top", "fastest"}
    assert set(out["predicted"]) == {"iteration_time_ms", "peak_mem_mib", "max_mem_mib", "mem_variance_mib2",
                                     "min_margin", "phi"}  # the closed form: no min_margin_high
    assert len(out["predicted"]["peak_mem_mib"]) == 20
    assert out["weights"]["profile"] in ("default", "safety", "throughput") and len(out["weights"]["w"]) == 3
    assert out["space"]["total"] >= out["space"]["feasible"] > 0
    assert len(out["top"]) == 3 and out["pick"] == {"rule": "balanced-front", "margin_floor": 0.1}
    # the pick is Φ's best unless a guard set it aside: then it is on the (T, margin, V) front
    assert out["top"][0]["plan"] == out["plan"] or out["plan"] in [e["plan"] for e in out["pareto"]]
    assert out["explanation"][0].startswith("pick rule `balanced-front`")
    # balanced-front: clears the floor, within 2 % of the fastest kept plan that clears it, no kept plan
    # dominates it on (time, margin), and no undominated kept plan within those 2 % has a smaller Φ
    q, kept = out["predicted"], [*out["top"], out["fastest"], *out["pareto"]]
    safe = [e["predicted"] for e in kept if e["predicted"]["min_margin"] >= 0.1]
    t_safe = min(e["iteration_time_ms"] for e in safe)
    assert q["min_margin"] >= 0.1 and q["iteration_time_ms"] <= 1.02 * t_safe * (1 + 1e-6)

    def dominated(p):
        return any(e["iteration_time_ms"] <= p["iteration_time_ms"] and e["min_margin"] >= p["min_margin"]
                   and (e["iteration_time_ms"] < p["iteration_time_ms"] or e["min_margin"] > p["min_margin"])
                   for e in safe)

    assert not dominated(q)
    near = [e for e in safe if e["iteration_time_ms"] <= 1.02 * t_safe and not dominated(e)]
    assert not any(e["phi"] < q["phi"] * (1 - 1e-9) for e in near)
    assert any("closed form only" in w for w in out["warnings"])
    assert sum(s["layers"] for s in out["plan"]["stages"]) == 6


def test_table_and_markdown_and_megatron(tmp_path):
    tmp_path = tmp_path / "out"
    res = runner.invoke(app, ["plan", *SMALL])
    assert res.exit_code == 0 and "Plans: the pick first" in res.stdout and "capacity" in res.stdout
    md = runner.invoke(app, ["plan", *SMALL, "--format", "markdown", "--out", str(tmp_path)])
    assert md.exit_code == 0 and md.stdout.startswith("# MemX plan: llama-6l")
    meg = runner.invoke(app, ["plan", *SMALL, "--format", "megatron"])  # a three-vendor pick: Megatron cannot start it
    assert meg.exit_code == 6 and "stock Megatron-LM cannot start this plan" in meg.stderr
    assert "#   --pipeline-model-parallel-size" in meg.stdout and "#   --global-batch-size 16" in meg.stdout
    assert {p.name for p in tmp_path.iterdir()} == {"plan.json", "plan.md", "megatron.sh", "flagscale.yaml", "report.html",
                                                   "memory.png", "pareto.png", "timeline.png"}
    assert (tmp_path / "megatron.sh").stat().st_mode & 0o111 and not (tmp_path / "plan.json").stat().st_mode & 0o111
    assert json.loads((tmp_path / "plan.json").read_text())["plan"]["model"] == "llama-6l"


def test_unknown_model_exits_2_with_known_names():
    res = runner.invoke(app, ["plan", "--model", "gpt5"])
    assert res.exit_code == 2 and "gpt5" in res.stderr and "llama2-7b" in res.stderr


def test_invalid_search_yaml_exits_2_naming_file_and_field(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text("name: s\nglobal_batch: 16\nrecompute_levels: [none, sometimes]\n")
    res = runner.invoke(app, ["plan", *SMALL[:2], "--search", str(bad)])
    assert res.exit_code == 2 and str(bad) in res.stderr and "recompute_levels" in res.stderr and "selective" in res.stderr


def test_bad_weights_exit_2():
    res = runner.invoke(app, ["plan", *SMALL, "--weights", "0.9,0.9,0.9"])
    assert res.exit_code == 2 and "wT,wM,wV" in res.stderr


def test_infeasible_exits_3_with_reason():
    res = runner.invoke(app, ["plan", "--cluster", "v100-t4-6", "--model", "llama2-70b", "--search", "small"])
    assert res.exit_code == 3 and "llama2-70b needs" in res.stderr and "v100-t4-6" in res.stderr


def test_catalog_lists_names():
    res = runner.invoke(app, ["catalog", "clusters"])
    assert res.exit_code == 0 and "three-vendor-20" in res.stdout.split()


def test_check_same_better_worse_and_margin(tmp_path):
    res = runner.invoke(app, ["plan", *SMALL, "--format", "json"])
    base = tmp_path / "base.json"
    base.write_text(res.stdout)
    same = runner.invoke(app, ["plan", *SMALL, "--format", "json", "--check", str(base), "--min-margin", "0",
                               "--summary", str(tmp_path / "s.md")])
    assert same.exit_code == 0 and "**same**" in (tmp_path / "s.md").read_text()
    rows = {r.split("|")[1].strip(): r.split("|")[2:4] for r in (tmp_path / "s.md").read_text().splitlines() if r.startswith("| ")}
    assert all(a == b for a, b in rows.values() if a.strip() != "new plan")  # unchanged input: identical figures, Φ too
    # A deliberately poor baseline (the fastest plan's layout with every stage fully recomputing)
    # is beaten: exit 0, verdict better.
    out = json.loads(res.stdout)
    poor = out["fastest"]["plan"]
    for st in poor["stages"]:
        st["recompute"] = "full"
        st.pop("recompute_layers", None)
    (tmp_path / "poor.json").write_text(json.dumps(poor))
    better = runner.invoke(app, ["plan", *SMALL, "--format", "json", "--check", str(tmp_path / "poor.json"),
                                 "--min-margin", "0"])
    assert better.exit_code == 0 and "**better**" in better.stderr
    # Worse: the baseline is the Φ-best of the small space; a search that may not use the baseline's
    # micro batch can only find a plan with a higher Φ → exit 4.
    # (pick_rule phi: the check judges by Φ as the rule does; issue #22)
    phi_best = out["top"][0]["plan"]
    (tmp_path / "phi_best.json").write_text(json.dumps(phi_best))
    other_mb = 1 if phi_best["micro_batch"] != 1 else 2
    narrow = tmp_path / "narrow.yaml"
    narrow.write_text(f"name: narrow\nglobal_batch: 16\ntp_options: [1, 2, 4]\nmicro_batch_options: [{other_mb}]\n"
                      f"recompute_levels: [none, full, block]\nmax_pp: 4\nweights: {out['weights']['profile']}\n"
                      "pick_rule: phi\n")
    worse = runner.invoke(app, ["plan", "--model", "llama-6l", "--search", str(narrow), "--format", "json",
                                "--check", str(tmp_path / "phi_best.json"), "--min-margin", "0"])
    assert worse.exit_code == 4 and "**worse**" in worse.stderr
    low = runner.invoke(app, ["plan", *SMALL, "--format", "json", "--check", str(base), "--min-margin", "0.99"])
    assert low.exit_code == 4 and "low-margin" in low.stderr


def test_check_bad_baseline_exits_2(tmp_path):
    (tmp_path / "b.json").write_text("{not json")
    res = runner.invoke(app, ["plan", *SMALL, "--check", str(tmp_path / "b.json")])
    assert res.exit_code == 2 and "b.json" in res.stderr


def test_plan_files_round_trip_through_simulate_plan(tmp_path):
    out = tmp_path / "out"
    assert runner.invoke(app, ["plan", "--cluster", "xy-2", *SMALL, "--out", str(out)]).exit_code == 0
    report = runner.invoke(app, ["simulate", "plan", str(out / "plan.json")])  # model and cluster from the plan
    assert report.exit_code == 0, report.output
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(json.loads((out / "plan.json").read_text())["plan"]))
    again = runner.invoke(app, ["simulate", "plan", str(bare), "--seed", "0"])
    assert again.exit_code == 0 and json.loads(again.stdout) == json.loads(report.stdout)


@pytest.mark.parametrize("option,make,needle", [
    ("--out", lambda t: (t / "f").write_text("x") and t / "f" / "sub", "is not a folder"),
    ("--out", lambda t: (t / "f").write_text("x") and t / "f", "is not a folder"),
    ("--check", lambda t: t, "is a folder"),
    ("--summary", lambda t: t, "is a folder"),
])
def test_output_paths_are_checked_before_the_search(tmp_path, option, make, needle):
    path = make(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    res = runner.invoke(app, ["plan", *SMALL, option, str(path)])
    assert res.exit_code == 2 and needle in res.stderr and "Traceback" not in res.output
    assert "Searched" not in res.output and sorted(tmp_path.rglob("*")) == before


def test_a_prime_global_batch_says_what_it_ruled_out(tmp_path):
    search = tmp_path / "odd.yaml"
    search.write_text("name: odd\nglobal_batch: 127\ntp_options: [1, 2]\nmicro_batch_options: [1, 2, 4]\nmax_pp: 4\n"
                      "use_all_gpus: false\n")
    res = runner.invoke(app, ["plan", "--cluster", "three-vendor-20", "--model", "llama-6l", "--search", str(search),
                              "--format", "json"])
    assert res.exit_code == 0, res.output
    warning = [line for line in res.stderr.splitlines() if line.startswith("warning: global_batch 127")]
    assert len(warning) == 1 and "rules out micro batch 2, 4 and dp 2-8" in warning[0] and "keeps micro batch 1 and dp 1" in warning[0]
    assert json.loads(res.stdout)["plan"]["dp"] == 1


def test_a_divisible_global_batch_warns_nothing():
    res = runner.invoke(app, ["plan", *SMALL, "--format", "json"])
    assert res.exit_code == 0 and "warning: global_batch" not in res.stderr


def test_a_reused_search_says_when_it_ran_not_a_search_time():
    from memx.report.table import to_markdown

    obj = json.loads(runner.invoke(app, ["plan", *SMALL, "--format", "json"]).stdout)
    obj["reused"] = {"search_s": 173.4, "created_at": "2026-11-30T20:01:02.123456+00:00"}
    text = to_markdown(obj)
    assert "reused (searched in 173 s on 2026-11-30 20:01 UTC)" in text and "in 173.4 s" not in text


def test_missing_records_fail_before_any_service_starts(tmp_path):
    res = runner.invoke(app, ["plan", *SMALL, "--backend", "records", "--records", str(tmp_path / "none.csv")])
    assert res.exit_code == 2 and "--records" in res.stderr and "no such file" in res.stderr
    assert not (tmp_path / "memx-home" / "prefect").exists()
