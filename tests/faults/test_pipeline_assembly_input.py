"""Bad pipeline_assembly input (issues #22, #27): a value other than the allowed assemblies exits 2 naming the
file, the field and the allowed values, before any search, and writes nothing."""

from __future__ import annotations

import pytest

from tests.support.bad_plans import assert_bad_search

CASES = [
    ("unknown", "pipeline_assembly: dag\n", ("pipeline_assembly", "'paper'", "'cycle-mean'", "'cycle-mean-drain'", "dag")),
    ("not-a-string", "pipeline_assembly: [paper]\n", ("pipeline_assembly", "'paper'", "'cycle-mean'")),
    ("underscore", "pipeline_assembly: cycle_mean\n", ("pipeline_assembly", "'cycle-mean'", "cycle_mean")),
]


@pytest.mark.parametrize("case, extra, names", CASES, ids=[c[0] for c in CASES])
def test_bad_pipeline_assembly_exits_2_naming_file_field_and_values(case, extra, names, tmp_path):
    assert_bad_search(extra, names, tmp_path)
