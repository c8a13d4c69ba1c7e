"""When the sampler's α is replaced by π_θ (sync), and when π_ref is reset (docs/theory.md §5, §7).

Every driver (:class:`~grpo_lab.loop.GRPOLoop`, the closed-form bandit engine, the TRL adapter)
drives a sync schedule with the same three calls per step k, in this one order::

    begin(k)        sync now? Decided before sampling from what is committed; changes nothing,
                    so a step whose sampling fails asks again, and re-syncs, when it is run again
                    (if it says yes: α ← π_θ, then the batch is sampled from α and planned)
    mark_synced(k)  only once the batch sampled after the sync exists: α = π_k is committed
    end(drift)      what the step measured of the drift of α from π_k, or None when it measured
                    nothing (:meth:`grpo_lab.plan.StepPlan.observed_drift` decides which)

``lag(k) = k − k0`` with k0 the step of the last committed sync, so α = π_{k0}; a driver reads it
after ``mark_synced``. ``tests/test_plan.py`` (the loop, the closed-form engine) and ``tests/test_trl.py`` (the
TRL adapter) check this order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .checks import require_choice, require_int_at_least, require_number_in

SYNC_MODES = ("fixed", "adaptive")


@dataclass
class SyncSchedule:
    """Fixed period: sync at every k with k % v == 0 (Algorithm 1).

    ==== =============================================================
    v    sync period; v = 1 is on-policy (α = π_k at every step)
    k0   last sync step, v·⌊k/v⌋; the lag k − k0 cycles 0 … v−1
    ==== =============================================================
    """

    v: int = 1
    last_sync: int = field(default=-1, init=False)

    def __post_init__(self) -> None:
        require_int_at_least("v", self.v, 1)

    def begin(self, k: int) -> bool:
        """Sync α ← π_θ before sampling step k? Always at the first step (α unknown)."""
        return k % self.v == 0 or self.last_sync < 0

    def mark_synced(self, k: int) -> None:
        """Commit the sync of step k, once its batch exists."""
        self.last_sync = k

    def lag(self, k: int) -> int:
        return k - self.last_sync

    def end(self, drift: float | None) -> None:
        """The drift step k measured (mean |log π_k − log α| over its counted tokens), or None when it
        measured none. A fixed schedule checks it and keeps nothing."""
        if drift is not None:
            require_number_in("drift", drift, 0.0)

    def state_dict(self) -> dict:
        return {"last_sync": self.last_sync}

    def load_state_dict(self, state: dict) -> None:
        self.last_sync = int(state["last_sync"])


@dataclass
class AdaptiveSyncSchedule(SyncSchedule):
    """Sync when the measured drift of α from π_k passes ``threshold`` (docs/theory.md §7).

    The drift is the batch mean of |log π_k − log α| over the counted tokens
    (logged as ``log_ratio_k_abs``): the tokens come from α, so it is a per-token proxy
    of KL(α ‖ π_k), not the TV(π_k, α) that Theorem 1 charges (``tv_estimate``),
    available from log-probs the step computes anyway. ``v`` is the longest lag allowed,
    so the schedule never lags more than a fixed ``v`` would. A step that measured
    no drift (``end(None)``) leaves the last measured one in force.
    """

    v: int = 16
    threshold: float = 0.05
    last_drift: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_number_in("threshold", self.threshold, 0.0, math.inf, low_open=True)

    def begin(self, k: int) -> bool:
        return self.last_sync < 0 or k - self.last_sync >= self.v or self.last_drift > self.threshold

    def mark_synced(self, k: int) -> None:
        super().mark_synced(k)
        self.last_drift = 0.0

    def end(self, drift: float | None) -> None:
        super().end(drift)
        if drift is not None:
            self.last_drift = float(drift)

    def state_dict(self) -> dict:
        return {"last_sync": self.last_sync, "last_drift": self.last_drift}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.last_drift = float(state["last_drift"])

def make_sync_schedule(sync: str, v: int, threshold: float) -> SyncSchedule:
    """The one sync rule of every route (GRPOLoop, the closed-form bandit engine, the TRL adapter):
    every v steps (``sync="fixed"``), or when the measured drift passes ``threshold`` and at least
    every v steps (``"adaptive"``: v is the longest lag)."""
    require_choice("sync", sync, SYNC_MODES)
    return AdaptiveSyncSchedule(v=v, threshold=threshold) if sync == "adaptive" else SyncSchedule(v)


@dataclass(frozen=True)
class RefResetSchedule:
    """π_ref ← π_θ after every ``ref_period`` steps (0 = never reset)."""

    ref_period: int = 0

    def __post_init__(self) -> None:
        require_int_at_least("ref_period", self.ref_period, 0)

    def should_reset(self, k: int) -> bool:
        """True after step k when π_ref should take the current weights."""
        return self.ref_period > 0 and (k + 1) % self.ref_period == 0
