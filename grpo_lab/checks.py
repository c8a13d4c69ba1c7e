"""Input validation shared by every module: each check raises a ``ValueError``
that names the parameter and the offending value, before any expensive work."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch


def require_int_at_least(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` if it is an ``int`` >= ``minimum``; else raise naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def require_truncation(top_p: Any, top_k: Any) -> tuple[float, int]:
    """``(top_p, top_k)`` if top_p is in (0, 1] and top_k an int >= 0 (0: no top-k cut); else raise
    naming the bad one. The nucleus and top-k knobs of every sampler and config."""
    return require_number_in("top_p", top_p, 0.0, 1.0, low_open=True), require_int_at_least("top_k", top_k, 0)


def require_number_in(name: str, value: Any, low: float = -math.inf, high: float = math.inf,
                      low_open: bool = False) -> float:
    """Return ``value`` if it is a finite real in [low, high] (``(low, high]`` if
    ``low_open``); else raise naming it."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and value <= high
    if not ok:
        lo = "(" if low_open else "["
        raise ValueError(f"{name} must be a finite number in {lo}{low}, {high}], got {value!r}")
    return float(value)


def require_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``; else raise listing them."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def require_reward_groups(rewards: torch.Tensor, name: str = "rewards") -> torch.Tensor:
    """Check the rewards of a step as groups: a ``[P, G]`` tensor (one group of G per prompt),
    2-D, G >= 2, finite, inside [0, 1]. (One value per completion, straight from a reward
    function, is checked by :func:`grpo_lab.lm.rewards.require_reward_values`.)

    The error names the first bad prompt index and its value, so a broken reward
    function is found at once.
    """
    if not isinstance(rewards, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [P, G], got {type(rewards).__name__}")
    if rewards.dim() != 2:
        raise ValueError(f"{name} must have shape [P, G], got shape {tuple(rewards.shape)}")
    if rewards.shape[0] == 0:
        raise ValueError(f"{name} is empty (P = 0 prompts)")
    if rewards.shape[1] < 2:
        raise ValueError(f"group size G must be >= 2 to whiten, got G = {rewards.shape[1]}")
    bad = ~torch.isfinite(rewards) | (rewards < 0) | (rewards > 1)
    if bad.any():
        p, g = (int(t) for t in bad.nonzero()[0])
        raise ValueError(
            f"{name}[{p}, {g}] = {rewards[p, g].item()!r} (prompt {p}, sample {g}): "
            "rewards must be finite and inside [0, 1]")
    return rewards


def require_same_shape(**tensors: torch.Tensor) -> None:
    """Raise if the named tensors do not all have one shape."""
    shapes = {k: tuple(t.shape) for k, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}")


LOG_PROB_TOLERANCE = 1e-3
"""How far above 0 a log-probability may lie and still count as one (nats). A log-probability computed in float32,
as the kit, TRL and vLLM compute theirs (log_softmax of float32 logits), is ≤ 0 up to rounding: a row of float32
log-probs summed to 1 + 3.5e-7 in probability, so one value can exceed 0 by ~1e-6. Storing it in bfloat16 keeps its
sign (rounding to a format never crosses 0). 1e-3 is a thousand times that rounding, and far below what a mistake
passes: a probability or an importance ratio given as a log-probability is its own value, ≥ 1e-3 in any real batch
(a ratio sits near 1). Log-probabilities computed by subtraction in bfloat16 itself (logit − logsumexp, each rounded
to 8 bits) can be off by 2⁻⁸ times the logits' size in either direction: upcast before the log-softmax instead."""


def require_log_probs(**tensors: torch.Tensor) -> None:
    """Raise a ValueError naming the first tensor with a value above :data:`LOG_PROB_TOLERANCE`, and that value: a
    log-probability is ≤ 0, so a positive one is a probability or a ratio passed where its log belongs. Only finite
    values are judged: NaN and ±inf are a failed forward, not a mix-up, and the loop's non-finite guard stops on them
    naming the step. One host read for all the tensors."""
    peaks = [torch.where(t.isfinite(), t.detach(), -math.inf).amax().double() if t.numel() else torch.tensor(-math.inf,
             dtype=torch.float64) for t in tensors.values()]
    for name, peak in zip(tensors, torch.stack([p.to(peaks[0].device) for p in peaks]).tolist()):
        if peak > LOG_PROB_TOLERANCE:
            raise ValueError(f"{name} must hold log-probabilities (≤ 0, up to {LOG_PROB_TOLERANCE:g}), got a value "
                             f"of {peak:.6g}: pass log π, not a probability π or a ratio π/α")
