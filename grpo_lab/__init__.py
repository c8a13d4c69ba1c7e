"""grpo_lab — off-policy GRPO, step by step (the symbols of docs/theory.md throughout).

Where things live: the algorithm at the top, one subpackage per kind of use.

=========================== ==========================================================
``algorithm1``              Algorithm 1 on one page: one off-policy step, equation → code (read first)
``advantages``              whitening A_α and the zero-variance mask m(x)         (§2)
``objective``               ratios r, r′, clipped surrogate f_ε, KL, token weights (§3)
``schedules``               when α ← π_θ (v, adaptive) and π_ref ← π_θ           (§5, §7)
``sync_audit``              after each sync, did α take π_θ's weights? (``SyncError``)
``plan``                    the rules of one step: advantages, mask, token weights, empty-step decision
``rollout``                 a sampled batch, and the loop's protocols: Policy, Sampler, Task
``loop``                    Algorithm 1, the one (v, i) loop                      (§5)
``config``                  GRPOConfig, one field per knob
``checks``                  the validators that name a bad value
``threads``                 how many torch threads: the cores the load leaves free (``choose_threads``)
``files``                   atomic writes, whole lines; DiskError for a full or read-only disk
``exact/``                  exact computations: ``bandit`` (J, L_α, TV, Theorem 1's bound, §4),
                            ``closed_form`` (the live panel's engine), ``studies`` (notebook 01's
                            numbers), ``digits_lm`` (the same terms exactly on SmolLM2)
``lm/``                     language models: ``models``, ``policy`` (log π_θ), ``sampling`` (the lagged
                            α in-process), ``sampling_vllm`` (α on vLLM), ``decoding`` (α's decoding
                            forward), ``tasks``, ``rewards``, ``verifier_pool`` (math-verify's worker),
                            ``text_task``, ``train_config``, ``build``, ``training``, ``evaluate``,
                            ``checkpoint``, ``memory``, ``recipes``, ``group_view``, ``cli``
``scale/``                  GPUs and wall clock: ``trl`` (the TRL adapter), ``launch``, ``costmodel``
                            (step(v) = gen + train + sync / v, §7), ``throughput`` (measured step costs)
``study/``                  the studies, on exact J: ``frontier`` (notebook 02's lag frontier), time
                            to accuracy against TRL (notebook 03: ``time_to_accuracy``, ``tta_units``,
                            ``tta_trl``, ``passage``, ``tta_summary``), ``results``
                            (statistics: t intervals, paired tests)
``viz/``                    drawing only: display switch, figures, widgets, exercises, ``demo``
=========================== ==========================================================

The top level imports only torch-level primitives; ``lm``, ``scale`` and ``study`` import
``transformers`` (the ``llm`` extra) when you import them.
"""

from .advantages import whiten, zero_variance_mask
from .config import GRPOConfig
from .loop import GRPOLoop, StepRecord
from .objective import (
    aggregate_loss,
    clip_bounds,
    clipped_surrogate,
    grpo_objective,
    kl_estimate,
    loss_weights,
    tv_terms,
)
from .plan import StepPlan, plan_step
from .rollout import Policy, Rollout, Sampler, ScoringSampler, Task
from .schedules import AdaptiveSyncSchedule, RefResetSchedule, SyncSchedule
from .sync_audit import SyncError

__all__ = [
    "whiten", "zero_variance_mask", "clipped_surrogate", "clip_bounds", "kl_estimate", "loss_weights",
    "aggregate_loss", "grpo_objective", "tv_terms", "SyncSchedule", "AdaptiveSyncSchedule", "RefResetSchedule",
    "GRPOConfig", "GRPOLoop", "StepPlan", "plan_step", "Policy", "Sampler", "ScoringSampler", "Task", "Rollout",
    "StepRecord", "SyncError",
]
__version__ = "0.1.0"
