"""Recording a driver's step plans and sync-schedule calls, and the one call order of grpo_lab.schedules
(tests/test_plan.py for the loop and the closed-form engine, tests/test_trl.py for the TRL adapter)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from grpo_lab import StepPlan


def record_plans_and_schedule(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> tuple[list[StepPlan], list]:
    """Wrap ``module``'s plan_step and sync schedule: every plan, and every call in order, as
    ``(name, argument, answer)``: ``begin`` / ``mark_synced`` / ``end`` with theirs, ``plan`` as
    ``("plan", None, index of the plan)``."""
    plans: list[StepPlan] = []
    calls: list[tuple] = []
    real_plan, real_schedule = module.plan_step, module.make_sync_schedule

    def planned(*args: Any, **kwargs: Any) -> StepPlan:
        plans.append(real_plan(*args, **kwargs))
        calls.append(("plan", None, len(plans) - 1))
        return plans[-1]

    def make(*args: Any) -> Any:
        schedule = real_schedule(*args)
        for name in ("begin", "mark_synced", "end"):
            method = getattr(schedule, name)

            def recorded(*call_args: Any, _method: Any = method, _name: str = name) -> Any:
                answer = _method(*call_args)
                calls.append((_name, *call_args, answer))
                return answer

            setattr(schedule, name, recorded)
        return schedule

    monkeypatch.setattr(module, "plan_step", planned)
    monkeypatch.setattr(module, "make_sync_schedule", make)
    return plans, calls


def expected_order(calls: list[tuple]) -> list[tuple]:
    """The order grpo_lab.schedules prescribes for the steps ``calls`` began: per step k, ``begin(k)``, the
    step's plan (the batch exists), ``mark_synced(k)`` if and only if begin said yes, then ``end``."""
    order: list[tuple] = []
    for _, k, answer in (c for c in calls if c[0] == "begin"):
        order += [("begin", k), ("plan",)] + ([("mark_synced", k)] if answer else []) + [("end",)]
    return order


def assert_one_call_order(calls: list[tuple], last_end_pending: bool = False) -> None:
    """``calls`` follow :func:`expected_order` exactly. ``last_end_pending``: the driver ends a step when the
    next one begins (the TRL adapter), so the last step's ``end`` is still to come."""
    seen = [c[:2] if c[0] in ("begin", "mark_synced") else c[:1] for c in calls]
    expected = expected_order(calls)
    assert seen == (expected[:-1] if last_end_pending else expected), (
        f"schedule calls out of order: {seen[:12]}… against {expected[:12]}…")
