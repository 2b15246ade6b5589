"""The simulator's own catalog of per-GPU traits (conf/simulator/*.yaml)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from memx.domain.catalog import known_names
from memx.domain.errors import InputError, SpecError
from memx.simulator import load_traits


def test_every_catalog_gpu_has_traits(conf_root):
    for name in known_names("gpus", conf_root):
        assert load_traits(name, conf_root).name == name
    assert (conf_root / "simulator" / "default.yaml").is_file()


def test_unknown_gpu_falls_back_to_default(conf_root):
    assert load_traits("no-such-gpu", conf_root).name == "default"


def test_bad_traits_file_names_the_field(tmp_path, conf_root):
    shutil.copytree(conf_root / "simulator", tmp_path / "simulator")
    path = tmp_path / "simulator" / "a100-80g.yaml"
    path.write_text(path.read_text().replace("link_efficiency: 0.78", "link_efficiency: 1.7"))
    with pytest.raises(InputError, match="link_efficiency"):
        load_traits("a100-80g", tmp_path)


def test_every_bad_traits_field_is_named_at_once(tmp_path, conf_root):
    shutil.copytree(conf_root / "simulator", tmp_path / "simulator")
    path = tmp_path / "simulator" / "a100-80g.yaml"
    text = path.read_text().replace("link_efficiency: 0.78", "link_efficiency: 1.7")
    text = text.replace("recompute_penalty_factor:", "recompute_penalty_factor: 0.5  #").replace("name:", "color: red\nname:")
    path.write_text(text + "notes: free text is allowed\n")
    with pytest.raises(InputError) as e:
        load_traits("a100-80g", tmp_path)
    msg = str(e.value)
    assert str(path) in msg and all(f"'{f}'" in msg for f in ("link_efficiency", "recompute_penalty_factor", "color"))
    assert "notes" not in msg


def test_traits_are_checked_when_built(conf_root):
    good = load_traits("a100-80g", conf_root)
    with pytest.raises(SpecError) as e:
        dataclasses.replace(good, link_efficiency=0.0, noise_std_fraction=0.6)
    assert {p[0] for p in e.value.problems} == {"link_efficiency", "noise_std_fraction"}
