"""The simulator's own catalog of per-GPU traits (conf/simulator/*.yaml)."""

from __future__ import annotations

import shutil

import pytest

from memx.domain.catalog import known_names
from memx.domain.errors import InputError
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
