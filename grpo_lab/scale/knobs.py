"""The knobs of Algorithm 1 on the TRL route, spelled once: :data:`KNOBS` pairs each
:class:`~grpo_lab.config.GRPOConfig` field with its :class:`~grpo_lab.scale.trl.OffPolicyGRPOConfig` field
(TRL's name where the concept is TRL's, e.g. G → ``num_generations``).

The table drives all three places a knob appears on this route, so a new knob is one row (and, where TRL
has no field of its name, a one-line ``lab_field`` declaration in OffPolicyGRPOConfig, which the test asks
for):

================================ ============================================================================
:func:`trl_values`               a GRPOConfig's values under their TRL names (:func:`~.launch.trl_args`)
:func:`validate_trl_values`      OffPolicyGRPOConfig's values checked by GRPOConfig's own rules
:func:`lab_field`                an OffPolicyGRPOConfig field mirroring a knob: GRPOConfig's default, and its
                                 field docstring as the help
================================ ============================================================================

A GRPOConfig field with no TRL field of its own is listed in :data:`NOT_ONE_TO_ONE` with the reason;
:func:`~.launch.trl_args` derives its TRL values explicitly. ``tests/test_knobs.py`` fails on a field in
neither.

:data:`TRL_IS_MODES` maps each value of ``is_correction`` to stock TRL's own importance-sampling arguments, and
:func:`trl_correction_arguments` gives them with the KL's (``beta``, ``use_bias_correction_kl``): the weight TRL puts
on π_old/α_vLLM is the kit's c of π_k/α, so a stock ``trl.GRPOTrainer`` with those arguments computes the kit's loss
wherever π_old = π_k (``tests/test_trl_is_weight.py`` drives it, at β = 0 and β > 0). At β > 0 with the KL weighted
that holds only where both weights are π_θ/π_k per token: TRL's ``use_bias_correction_kl`` weight is π_θ/π_old, per
token at ``importance_sampling_level="token"`` and one sequence ratio at ``"sequence"``; the kit's is π_θ/base per
token, base = α under ``ratio``. So :func:`trl_correction_arguments` refuses ``ratio`` and ``level="sequence"`` with
the KL weighted at β > 0. The adapter itself keeps TRL's correction off and applies c to r′ = π_k/α, which carries
the lag, and its KL weight is the kit's.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import GRPOConfig
from ..objective import correction_level

TRL_OPTIMIZERS = {"adamw": "adamw_torch", "sgd": "sgd"}
"""GRPOConfig ``optimizer`` → TRL ``optim``."""


def _trl_max_grad_norm(norm: float | None) -> float:
    """No clipping is None in GRPOConfig and 0 in TRL."""
    return 0.0 if norm is None else norm


@dataclass(frozen=True)
class KnobSpec:
    """GRPOConfig field ``lab_name`` is OffPolicyGRPOConfig field ``trl_name``. ``to_trl`` maps the value where
    TRL spells it differently; None means the same value, which GRPOConfig's rules then validate on the TRL
    side too (a mapped value is in TRL's vocabulary, so TRL validates it)."""

    lab_name: str
    trl_name: str
    to_trl: Callable[[Any], Any] | None = None

    def trl_value(self, config: GRPOConfig) -> Any:
        value = getattr(config, self.lab_name)
        return value if self.to_trl is None else self.to_trl(value)


KNOBS: tuple[KnobSpec, ...] = (
    KnobSpec("G", "num_generations"),
    KnobSpec("v", "vllm_sync_interval"),
    KnobSpec("i", "num_iterations"),
    KnobSpec("sync", "sync"),
    KnobSpec("sync_threshold", "sync_threshold"),
    KnobSpec("eps_low", "epsilon"),
    KnobSpec("eps_high", "epsilon_high"),
    KnobSpec("band", "clip_band"),
    KnobSpec("beta", "beta"),
    KnobSpec("kl_importance_weighted", "kl_importance_weighted"),
    KnobSpec("kl_weight_differentiable", "use_bias_correction_kl"),
    KnobSpec("eps_std", "eps_std"),
    KnobSpec("unbiased_std", "unbiased_std"),
    KnobSpec("eps_placement", "eps_placement"),
    KnobSpec("mask_zero_variance", "zero_variance_mask"),
    KnobSpec("mask_normalize", "mask_normalize"),
    KnobSpec("empty_step", "empty_step"),
    KnobSpec("loss_type", "loss_type"),
    KnobSpec("level", "importance_sampling_level"),
    KnobSpec("is_correction", "is_correction"),
    KnobSpec("is_cap", "is_cap"),
    KnobSpec("is_floor", "is_floor"),
    KnobSpec("is_level", "is_level"),
    KnobSpec("lr", "learning_rate"),
    KnobSpec("optimizer", "optim", TRL_OPTIMIZERS.__getitem__),
    KnobSpec("weight_decay", "weight_decay"),
    KnobSpec("max_grad_norm", "max_grad_norm", _trl_max_grad_norm),
    KnobSpec("max_completion_length", "max_completion_length"),
    KnobSpec("temperature", "temperature"),
    KnobSpec("seed", "seed"),
    KnobSpec("sync_audit", "sync_audit"),
)

NOT_ONE_TO_ONE: dict[str, str] = {
    "prompts_per_step": "batch geometry: P·G rows per step = per_device_train_batch_size × processes × "
                        "gradient_accumulation_steps (= steps_per_generation)",
    "micro_batch_size": "batch geometry: per_device_train_batch_size (None: P·G rows / processes)",
    "steps": "max_steps = steps · i: TRL counts optimiser passes, i per step k",
    "ref_period": "sync_ref_model = ref_period > 0 and ref_model_sync_steps = ref_period · i (optimiser passes)",
    "kl_kind": "TRL computes the k3 estimator only: trl_args refuses any other",
    "offpolicy_split": "not on the TRL route (trl_args refuses it): without vLLM, log α comes from the trainer's "
                       "own forward of the synced copy α (nothing to split off but a top_p/top_k cut); with vLLM, "
                       "π_sync needs a full unsharded copy of π_θ on every process",
}
"""GRPOConfig fields :func:`~.launch.trl_args` maps by hand, and why no row can."""

_BY_LAB = {knob.lab_name: knob for knob in KNOBS}


@dataclass(frozen=True)
class ISModeSpec:
    """``is_correction`` = ``value`` is stock TRL's vLLM importance sampling with
    ``vllm_importance_sampling_mode`` = ``f"{is_level}_{constraint}"`` (the level of the weight c, the kit's
    ``is_level``; TRL's ``importance_sampling_level`` is the kit's ``level``, the clipped ratio's) and the bounds
    ``clip_min`` / ``clip_max`` of the config; ``constraint`` None means TRL's correction off. ``levels`` / ``bands``:
    where TRL has an equal (else no row applies)."""

    value: str
    constraint: str | None
    clip_min: Callable[[GRPOConfig], float | None]
    clip_max: Callable[[GRPOConfig], float | None]
    levels: tuple[str, ...] = ("token", "sequence")
    bands: tuple[str, ...] = ("additive", "multiplicative")


def _no_bound(config: GRPOConfig) -> None:
    return None


def _cap(config: GRPOConfig) -> float:
    return config.is_cap


TRL_IS_MODES: tuple[ISModeSpec, ...] = (
    # c = 1 against α is TRL's weight π_old/α, never dropped, times its clip around 1: the multiplicative band
    ISModeSpec("ratio", "mask", _no_bound, _no_bound, levels=("token",), bands=("multiplicative",)),
    ISModeSpec("truncated", "truncate", _no_bound, _cap),                                 # min(ρ, C)
    ISModeSpec("mask", "mask", lambda config: 1.0 / config.is_cap, _cap),                 # ρ·1[1/C ≤ ρ ≤ C]
    ISModeSpec("icepop", "mask", lambda config: config.is_floor, _cap),                   # ρ·1[a ≤ ρ ≤ C]
    ISModeSpec("none", None, _no_bound, _no_bound),                                       # c = 1 against π_k
)
"""One row per value of ``GRPOConfig.is_correction`` (ρ = π_k/α per token, or Π_t per sequence at
``is_level="sequence"``, TRL's sum of log-ratios):

============= ==================================== ===================== ===================
is_correction ``vllm_importance_sampling_mode``     ``…_clip_min``         ``…_clip_max``
============= ==================================== ===================== ===================
``ratio``     ``token_mask`` (band multiplicative) None                  None
``truncated`` ``token_truncate`` / ``sequence_…``   None                  C
``mask``      ``token_mask`` / ``sequence_mask``    1/C                   C
``icepop``    ``token_mask`` / ``sequence_mask``    a (``is_floor``)      C
``none``      correction off                        —                     —
============= ==================================== ===================== ===================

TRL 1.16's own default is ``sequence_mask`` with clip_max 3 and clip_min None (its docstring still calls
``token_truncate`` the default; the field's default is ``sequence_mask``) at ``importance_sampling_level="token"``:
the kit's ``icepop`` with ``level="token"``, ``is_level="sequence"``, C = 3 and ``is_floor=None``, at every pass
(``tests/test_trl_is_weight.py``)."""


def trl_correction_arguments(config: GRPOConfig) -> dict[str, Any]:
    """The stock ``trl.GRPOConfig`` arguments under which TRL's correction and KL term are the kit's for
    ``config``'s ``is_correction``, ``is_cap``, ``is_floor``, ``level``, ``is_level`` (:data:`TRL_IS_MODES`),
    ``beta`` and KL weight, wherever π_old = π_k. Raises a ValueError naming the value where TRL has no equal:
    ``ratio`` at level sequence or with the additive band; and at β > 0 a KL estimator other than k3 (TRL computes
    k3 only), the detached ``kl_importance_weighted`` (no TRL field), or ``kl_weight_differentiable`` under
    ``ratio`` (TRL weights the KL by π_θ/π_old, the kit by π_θ/α) or at ``level="sequence"`` (TRL weights it by
    the sequence's exp(mean_t log π_θ/π_old), the kit per token)."""
    (row,) = (row for row in TRL_IS_MODES if row.value == config.is_correction)
    is_level = correction_level(config.is_correction, config.level, config.is_level)
    if config.level not in row.levels or config.band not in row.bands:
        raise ValueError(f"is_correction = {config.is_correction!r} with level = {config.level!r} and band = "
                         f"{config.band!r} has no TRL equal: TRL offers it at level {row.levels} with band "
                         f"{row.bands}")
    if config.beta > 0:
        if config.kl_kind != "k3":
            raise ValueError(f"kl_kind = {config.kl_kind!r} at beta = {config.beta} has no TRL equal: TRL computes k3")
        if config.kl_importance_weighted and not config.kl_weight_differentiable:
            raise ValueError(f"kl_importance_weighted = True at beta = {config.beta} has no TRL equal: TRL's KL "
                             "weight (use_bias_correction_kl) keeps its gradient (kl_weight_differentiable)")
        if config.kl_weight_differentiable and (config.is_correction == "ratio" or config.level == "sequence"):
            raise ValueError(
                f"kl_weight_differentiable = True at beta = {config.beta} with is_correction = "
                f"{config.is_correction!r} and level = {config.level!r} has no TRL equal: TRL's use_bias_correction_kl "
                "weights the KL by π_θ/π_old, per token only at importance_sampling_level='token', and the kit by "
                "π_θ/base per token (base = α under 'ratio')")
    arguments: dict[str, Any] = {"importance_sampling_level": config.level,
                                 "vllm_importance_sampling_correction": row.constraint is not None,
                                 "beta": config.beta, "use_bias_correction_kl": config.kl_weight_differentiable}
    if row.constraint is not None:
        arguments |= {"vllm_importance_sampling_mode": f"{is_level}_{row.constraint}",
                      "vllm_importance_sampling_clip_min": row.clip_min(config),
                      "vllm_importance_sampling_clip_max": row.clip_max(config)}
    return arguments


def trl_values(config: GRPOConfig) -> dict[str, Any]:
    """Every row's value of ``config``, keyed by its TRL name."""
    return {knob.trl_name: knob.trl_value(config) for knob in KNOBS}


def validate_trl_values(config: Any) -> GRPOConfig:
    """The GRPOConfig of the same-valued knobs of ``config`` (an OffPolicyGRPOConfig; what
    :func:`grpo_lab.plan.plan_step` reads on the TRL route), so checked by GRPOConfig's own rules, all
    together (rules joining several apply). The error names the TRL field: checks.py's messages start with
    the field's name."""
    lab_values = {knob.lab_name: getattr(config, knob.trl_name) for knob in KNOBS if knob.to_trl is None}
    try:
        return GRPOConfig(**lab_values)
    except ValueError as error:
        knob = _BY_LAB.get(next(iter(str(error).split()), ""))
        if knob is None or knob.trl_name == knob.lab_name:
            raise
        raise ValueError(f"{knob.trl_name} (GRPOConfig.{knob.lab_name}): {error}") from error


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of the dataclass ``cls`` (Python keeps none at run time), on one
    line."""
    (node,) = ast.parse(textwrap.dedent(inspect.getsource(cls))).body
    body = node.body
    return {field.target.id: " ".join(doc.value.value.split()) for field, doc in zip(body, body[1:], strict=False)
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
            and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)}


def lab_field(lab_name: str) -> Any:
    """The ``dataclasses.field`` of the OffPolicyGRPOConfig field that mirrors GRPOConfig's ``lab_name``: the
    same default, and GRPOConfig's docstring of it as the help (``%`` doubled: argparse formats help)."""
    if lab_name not in _BY_LAB:
        raise ValueError(f"lab_name = {lab_name!r} has no row in KNOBS")
    (default,) = (f.default for f in dataclasses.fields(GRPOConfig) if f.name == lab_name)
    help_text = f"GRPOConfig.{lab_name}: {field_docs(GRPOConfig)[lab_name]}".replace("%", "%%")
    return dataclasses.field(default=default, metadata={"help": help_text})
