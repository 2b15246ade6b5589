"""Φ (paper §3.1.2): the worked example, weight parsing and the automatic profile."""

import pytest

from memx.domain.catalog import load_cluster
from memx.domain.errors import InputError
from memx.planner.objective import PROFILES, auto_profile, heterogeneity, parse_weights, phi


def test_paper_worked_example():
    w = parse_weights("default")
    refs = (1000.0, 50_000.0, 1.0e8)
    a = phi(1.1 * refs[0], refs[1], 0.5 * refs[2], refs=refs, weights=w, epsilon_mib2=0.0)
    b = phi(refs[0], refs[1], refs[2], refs=refs, weights=w, epsilon_mib2=0.0)
    assert a == pytest.approx(0.79, abs=0.005) and b == pytest.approx(1.0)
    # With our ε = 1e4 MiB² against a median of 1e8 the example barely moves.
    assert phi(1.1e3, 5e4, 0.5e8, refs=refs, weights=w, epsilon_mib2=1e4) == pytest.approx(0.79, abs=0.005)


def test_zero_variance_does_not_zero_phi():
    w = parse_weights("default")
    assert phi(1.0, 1.0, 0.0, refs=(1.0, 1.0, 1e6), weights=w, epsilon_mib2=1e4) > 0


@pytest.mark.parametrize("spec, expected", [("default", (0.4, 0.2, 0.4)), ("safety", (0.3, 0.5, 0.2)),
                                            ("throughput", (0.7, 0.2, 0.1)), ("0.5,0.25,0.25", (0.5, 0.25, 0.25))])
def test_parse_weights(spec, expected):
    assert parse_weights(spec).as_tuple() == pytest.approx(expected)


@pytest.mark.parametrize("spec", ["fast", "0.5,0.5", "0.5,0.5,0.5", "-0.2,0.6,0.6", "a,b,c"])
def test_bad_weights_list_the_allowed_values(spec):
    with pytest.raises(InputError, match="allowed values are auto, default, safety, throughput"):
        parse_weights(spec)


def test_auto_profile_rules(conf_root):
    hetero = load_cluster("h100-h20-16", conf_root)
    homog_like = load_cluster("three-vendor-20", conf_root)
    assert heterogeneity(hetero) > 5
    assert auto_profile(hetero, fastest_min_margin=0.05).profile == "safety"
    assert auto_profile(hetero, fastest_min_margin=0.30).profile == "default"
    assert heterogeneity(homog_like) == pytest.approx((80 / 312) / (32 / 200))  # 80 GB / 312 TF vs 32 GB / 200 TF
    assert auto_profile(homog_like, fastest_min_margin=None).profile == "default"


def test_homogeneous_cluster_gets_throughput(tmp_path, conf_root):
    p = tmp_path / "h.yaml"
    p.write_text("name: h\ninter_node_bandwidth_gbps: 25\nnodes:\n  - {gpu: a100-80g, count: 8}\n  - {gpu: a100-80g, count: 8}\n")
    c = load_cluster(str(p), conf_root)
    assert heterogeneity(c) == 1.0
    assert auto_profile(c, fastest_min_margin=0.5).profile == "throughput"
    assert set(PROFILES) == {"default", "safety", "throughput"}
