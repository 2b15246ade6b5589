"""Bad front_tolerance input (issue #26): outside [0, 1), or not a number, exits 2 naming the file, the field and the
allowed range, before any search, and writes nothing; null is allowed (the whole max_time_ratio window)."""

from __future__ import annotations

import pytest

from tests.support.bad_plans import assert_bad_search

CASES = [
    ("one", "front_tolerance: 1.0\n", ("front_tolerance", "less than 1")),
    ("negative", "front_tolerance: -0.05\n", ("front_tolerance", "greater than or equal to 0")),
    ("not-a-number", "front_tolerance: wide\n", ("front_tolerance", "wide")),
    ("list", "front_tolerance: [0.1]\n", ("front_tolerance",)),
]


@pytest.mark.parametrize("case, extra, names", CASES, ids=[c[0] for c in CASES])
def test_bad_front_tolerance_exits_2_naming_file_field_and_range(case, extra, names, tmp_path):
    assert_bad_search(extra, names, tmp_path)
