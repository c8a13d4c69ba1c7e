"""grpo_lab — off-policy GRPO, step by step (the symbols of docs/theory.md throughout).

Where things live: the algorithm at the top, one subpackage per kind of use. Every module is named here, and
every name here is a module (tests/test_layout.py checks both).

=================== ==================================================================================
``algorithm1``      Algorithm 1 on one page: one off-policy step, equation beside code (read first)
``advantages``      whitening A_α and the zero-variance mask m(x)                         (§2)
``objective``       ratios r, r′, clipped surrogate f_ε, KL, token weights                (§3)
``plan``            the rules of one step: advantages, mask, token weights, the empty-step decision
``schedules``       when α ← π_θ (v, adaptive) and π_ref ← π_θ                           (§5, §7)
``protocols``       what the loop talks to (Policy, Sampler, ScoringSampler, Task) and the batch a
                    sampler draws (Rollout)
``loop``            Algorithm 1, the one (v, i) loop                                      (§5)
``fingerprint``     the sync proof: the weights α serves fingerprinted against π_θ's
``sync_audit``      after each sync, did α's behaviour move with π_θ's? (SyncError)
``config``          GRPOConfig, one field per knob
``checks``          the validators that name a bad value
``threads``         how many torch threads: the cores the load leaves free (choose_threads)
``files``           atomic writes, whole lines; DiskError for a full or read-only disk
``provenance``      where a result was made: commit, CPU and GPU, library versions, threads, load
``cli``             the ``grpo-lab`` command (train, eval): the entry point, imported by no module
``exact/``          exact computations: ``bandit`` (J, L_α, TV, Theorem 1's bound, §4), ``closed_form``
                    (the live panel's engine), ``bandit_lab`` (notebook 01's runs and numbers),
                    ``digits_lm`` (the same terms exactly on SmolLM2), ``correction_bias`` (each
                    correction's bias and variance under lag), ``strict_j`` and ``strict_answers``
                    (exact J on a real LM by a token-tree walk), ``live_run`` (notebook 02's
                    background run: thread, checkpoint, interrupts, when exact J is taken)
``lm/``             language models: ``models``, ``policy`` (log π_θ), ``sampling`` (the lagged α
                    in-process), ``sampling_vllm`` (α on vLLM), ``decoding`` (α's decoding forward),
                    ``tasks``, ``rewards``, ``verifier_pool`` (math-verify's worker), ``text_task``,
                    ``train_config``, ``recipes``, ``build``, ``training``, ``background`` (a run a
                    notebook draws as it trains), ``evaluate``, ``checkpoint``, ``memory`` and
                    ``disk_guard`` (the checks before a run), ``group_view`` (one group of a run)
``scale/``          GPUs and wall clock: ``trl`` (the TRL adapter), ``trl_surface`` (the TRL members it
                    relies on), ``knobs`` (lab name ↔ TRL name), ``launch``, ``costmodel``
                    (step(v) = gen + train + sync / v, §7), ``throughput`` (measured step costs),
                    ``repeats`` (throughput repeated, the ratio with its interval)
``stats/``          statistics over seeds, which know no study: ``intervals`` (Student's t, means
                    with their intervals, Welch's t), ``sequential`` (group-sequential looks)
``viz/``            drawing only: ``display`` (where figures go), ``plots`` and ``widgets`` (notebook
                    01's figures and live panel), ``exercises``, ``demo`` (``make demo``),
                    ``token_ratios`` (one group's r′ per token), ``dashboard`` (a run's metrics),
                    ``throughput`` (notebook 03's figures), ``live_panel`` (notebook 02's knobs and
                    figure over ``exact.live_run``)
=================== ==================================================================================

The top level imports only torch-level primitives; ``lm`` and ``scale`` import ``transformers`` (the ``llm``
extra) when you import them. The studies (``studies/`` of a checkout) are not part of the package.
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
from .protocols import Policy, Rollout, Sampler, ScoringSampler, Task
from .schedules import AdaptiveSyncSchedule, RefResetSchedule, SyncSchedule
from .sync_audit import SyncError

__all__ = [
    "whiten", "zero_variance_mask", "clipped_surrogate", "clip_bounds", "kl_estimate", "loss_weights",
    "aggregate_loss", "grpo_objective", "tv_terms", "SyncSchedule", "AdaptiveSyncSchedule", "RefResetSchedule",
    "GRPOConfig", "GRPOLoop", "StepPlan", "plan_step", "Policy", "Sampler", "ScoringSampler", "Task", "Rollout",
    "StepRecord", "SyncError",
]
__version__ = "0.1.0"
