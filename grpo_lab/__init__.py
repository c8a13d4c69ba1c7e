"""grpo_lab — off-policy GRPO, step by step (the symbols of docs/theory.md throughout).

Where things live:

====================== =========================================================
``advantages``         whitening A_α and the zero-variance mask m(x)         (§2)
``objective``          ratios r, r′, clipped surrogate f_ε, KL, aggregation  (§3)
``schedules``          when α ← π_θ (v, adaptive) and π_ref ← π_θ           (§5, §7)
``loop``               Algorithm 1, the one (v, i) loop                      (§5)
``config``             GRPOConfig, one field per knob
``bandit``             exact bandit: J, L_α, TV, Theorem 1's bound           (§4)
``bandit_closed_form`` the bandit's loop with the gradient in closed form (live panel)
``bandit_studies``     notebook 01's experiments and exact studies (numbers, no plots)
``checkpoint``         atomic save, exact resume
``costmodel``          step(v) = gen + train + sync / v                      (§7)
``models``             load_policy: bundled SmolLM2 (offline), local dir, hub id
``tasks``              problems: reasoning-gym, GSM8K, MATH500, AIME24, DeepScaleR
``rewards``            verifiable rewards with a real timeout
``policy``             LMPolicy: log π_θ of completions at temperature T
``sampling``           HFSampler: the lagged in-process α (log α of the tokens it draws)
``sampling_vllm``      VLLMSampler: α served by an in-process vLLM engine (GPU, or vLLM's CPU build)
``memory``             will an LLM run fit? estimate, measure, shrink micro-batches
``train_config``       TrainConfig: GRPOConfig plus model, task, evaluation, output
``text_task``          TextTask (prompts, verifiable rewards), train/eval problems
``build``              build_loop: π_θ, α and the text task wired into GRPOLoop
``training``           train: run or resume, metrics.jsonl, checkpoints, loggers
``recipes``            configs/*.yaml (+ key=value overrides) → TrainConfig
``evaluate``           Pass@k with n samples per question
``throughput``         measured step costs, cost-model fit, speed-up predictions
``trl``                OffPolicyGRPOTrainer: the same knobs on TRL (optional extra)
``launch``             a recipe on GPUs: ``accelerate launch -m grpo_lab.launch``
``viz``                drawing only: display switch, figures, widgets, exercises
``cli``                ``grpo-lab train | eval``
====================== =========================================================

The top level imports only torch-level primitives; the LLM modules import
``transformers`` (the ``llm`` extra) when you import them.
"""

from .advantages import whiten, zero_variance_mask
from .config import GRPOConfig
from .loop import GRPOLoop, Policy, Rollout, Sampler, StepRecord, Task
from .objective import (
    aggregate_loss,
    clip_bounds,
    clipped_surrogate,
    grpo_objective,
    kl_estimate,
    loss_weights,
    tv_terms,
)
from .schedules import AdaptiveSyncSchedule, RefResetSchedule, SyncSchedule

__all__ = [
    "whiten", "zero_variance_mask", "clipped_surrogate", "clip_bounds", "kl_estimate", "loss_weights",
    "aggregate_loss", "grpo_objective", "tv_terms", "SyncSchedule", "AdaptiveSyncSchedule", "RefResetSchedule",
    "GRPOConfig", "GRPOLoop", "Policy", "Sampler", "Task", "Rollout", "StepRecord",
]
__version__ = "0.1.0"
