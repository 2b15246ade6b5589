"""Null cells of the records tables (memx.domain.records re-exports `is_missing`)."""

from __future__ import annotations

import math
import sys
from typing import Any


def is_missing(value: Any) -> bool:
    """None, pandas NA or NaN: a null cell (a value can only be pandas NA once pandas is imported)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    pd = sys.modules.get("pandas")
    return pd is not None and value is pd.NA
