"""The cross-validated keep-or-drop check every part of a plan calibration passes (memx.learn.calibration:
time, memory; memx.learn.residual: the plan residual; issue #16)."""

from __future__ import annotations

from dataclasses import dataclass

GUARD_GAIN = 0.9  # kept only when the held-out error is at least 10 % (relative) below the uncalibrated one


@dataclass(frozen=True, kw_only=True)
class Guard:
    """Cross-validated check of one part of a fit (time, memory, plan residual): the part is kept only when
    its held-out error beats the error without it on the same plans by GUARD_GAIN; else it is left out."""

    base_mape: float  # uncalibrated, on the measured plans (time) or their GPUs (memory)
    cv_mape: float  # each plan predicted by a fit on the other folds
    folds: int

    @property
    def accepted(self) -> bool:
        return self.cv_mape < GUARD_GAIN * self.base_mape

    def to_dict(self) -> dict:
        return {"base_mape": self.base_mape, "cv_mape": self.cv_mape, "folds": self.folds, "accepted": self.accepted}
