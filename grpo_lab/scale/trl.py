"""Off-policy GRPO at scale: TRL's ``GRPOTrainer`` with a lagged sampler α and the kit's maths.

Stock TRL pushes π_θ to vLLM before every generation; :class:`OffPolicyGRPOTrainer` runs Algorithm 1 instead:
α ← π_θ only when the kit's sync schedule says so, the loss is :func:`grpo_lab.grpo_objective` with the step plan
of :func:`grpo_lab.plan.plan_step` (whitening, zero-variance mask, empty steps), and every sync is proved by the
sync audit. Without vLLM an in-process frozen copy of the model is α, so v works on a CPU.

================================== =====================================================================
TRL side                           the kit's
================================== =====================================================================
``vllm_sync_interval``             v (k % v == 0), or ``sync="adaptive"``
``clip_band``                      additive (paper) or multiplicative (TRL) band around r′ = π_k/α
``zero_variance_mask``             groups whose G rewards agree leave the loss
``is_correction``, ``is_cap``,     the correction on r′ (:data:`grpo_lab.scale.knobs.TRL_IS_MODES` maps each value
``is_floor``, ``is_level``         to TRL's ``vllm_importance_sampling_*``, which stays off here)
``use_bias_correction_kl``         ``kl_weight_differentiable``: the reverse-KL gradient of k3, weighted by π_θ/base
                                   (π_θ/α under ``ratio``; stock TRL's weight is π_θ/π_old)
``sync_audit``                     fingerprints of every tensor α serves, then a few tokens scored twice
================================== =====================================================================

Step k is one generation batch (``global_step = k · num_iterations``). The private TRL members the adapter
overrides or reads are listed in :data:`grpo_lab.scale.trl_surface.SURFACE`; the knobs are spelled once, in
:data:`grpo_lab.scale.knobs.KNOBS`; the logged ``off_policy/*`` metrics are docs/metrics.md's. How each part works
(truncated α, the mask's normalisation over processes, the KL weight, what is logged): docs/internals.md#trl-adapter.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import trl
from accelerate.utils import broadcast_object_list
from transformers import TrainerCallback
from trl.trainer.utils import add_fused_lm_head

from ..checks import require_truncation
from ..fingerprint import prove, prove_local
from ..lm.sampling import cuts, truncate_logprobs
from ..objective import RATIO_DIAGNOSTICS, grpo_objective, ratio_diagnostics, tv_terms
from ..plan import ObjectiveArgs, StepPlan, plan_step
from ..schedules import make_sync_schedule
from ..sync_audit import PROBE_CONTEXT, SyncAudit, SyncError, probe_span
from .knobs import lab_field, validate_trl_values
from .trl_surface import FORWARD_KEYS

# TRL options the off-policy objective replaces; each must keep the value shown.
_REQUIRED = {
    "vllm_importance_sampling_correction": False,  # r = π_θ/α already weights by the lag; TRL's would count it twice
    "scale_rewards": "group",  # whitening per group is done here (eps_std, unbiased_std, eps_placement)
    "multi_objective_aggregation": "sum_then_normalize",
    "top_entropy_quantile": 1.0, "off_policy_mask_threshold": None, "delta": None,
    "entropy_coef": 0.0, "use_adaptive_entropy": False,
}
_MEAN_METRICS = ("ratio_k_mean", "log_ratio_k_abs", "clip_low_frac", "clip_high_frac")


@dataclass
class OffPolicyGRPOConfig(trl.GRPOConfig):
    """``trl.GRPOConfig`` plus the knobs of Algorithm 1, under the names of
    :data:`grpo_lab.scale.knobs.KNOBS` (TRL's where the concept is TRL's: ``num_generations`` = G,
    ``num_iterations`` = i, ``epsilon`` / ``epsilon_high`` = ε_low / ε_high, ``ref_model_sync_steps`` =
    ref_period · i, …), validated by :class:`grpo_lab.GRPOConfig`'s rules. Defaults changed from TRL's:
    ``loss_type`` and ``use_bias_correction_kl`` (GRPOConfig's: ``grpo`` and False, where TRL's are ``dapo`` and
    True), ``ref_model_mixup_alpha`` 1 (a hard reset
    π_ref ← π_θ), ``disable_dropout`` True (with dropout, r′ = π_k/α ≠ 1 even at lag 0),
    ``vllm_importance_sampling_correction`` False."""

    vllm_sync_interval: int = lab_field("v")
    sync: str = lab_field("sync")
    sync_threshold: float = lab_field("sync_threshold")
    zero_variance_mask: bool = lab_field("mask_zero_variance")
    mask_normalize: str = lab_field("mask_normalize")
    empty_step: str = lab_field("empty_step")
    clip_band: str = lab_field("band")
    eps_std: float = lab_field("eps_std")
    unbiased_std: bool = lab_field("unbiased_std")
    eps_placement: str = lab_field("eps_placement")
    loss_type: str = lab_field("loss_type")
    use_bias_correction_kl: bool = lab_field("kl_weight_differentiable")
    kl_importance_weighted: bool = lab_field("kl_importance_weighted")
    is_correction: str = lab_field("is_correction")
    is_cap: float = lab_field("is_cap")
    is_floor: float | None = lab_field("is_floor")
    is_level: str | None = lab_field("is_level")
    sync_audit: bool = lab_field("sync_audit")
    ref_model_mixup_alpha: float = field(default=1.0, metadata={"help": "1 = hard reset π_ref ← π_θ."})
    disable_dropout: bool = field(default=True, metadata={"help": "log π and log α from the same deterministic net."})
    vllm_importance_sampling_correction: bool = field(default=False, metadata={
        "help": "Must stay False: the off-policy ratio π_θ/α already corrects for the sampler's lag."})
    vllm_enforce_eager: bool = field(default=False, metadata={
        "help": "Colocate: build the engine without torch.compile / CUDA graphs (on a CPU the inductor "
                "warm-up takes minutes)."})

    def __post_init__(self) -> None:
        validate_trl_values(self)  # before TRL's own checks, which can fail with an unrelated error first
        super().__post_init__()
        for name, required in _REQUIRED.items():
            if getattr(self, name) != required:
                raise ValueError(f"{name} = {getattr(self, name)!r} is not supported by the off-policy "
                                 f"objective; it must be {required!r}")
        if self.steps_per_generation != self.gradient_accumulation_steps:
            raise ValueError(f"steps_per_generation = {self.steps_per_generation} must equal "
                             f"gradient_accumulation_steps = {self.gradient_accumulation_steps}: "
                             "each optimiser pass covers the whole batch (docs/theory.md §5)")
        if self.vllm_enable_sleep_mode and self.vllm_sync_interval > 1:
            raise ValueError("vllm_enable_sleep_mode = True re-pushes π_θ on every wake-up, which breaks "
                             f"vllm_sync_interval = {self.vllm_sync_interval}; use one or the other")
        require_truncation(self.top_p, self.top_k)
        if not self.use_vllm and (self.min_p is not None or self.repetition_penalty != 1.0):
            raise ValueError(f"min_p = {self.min_p!r}, repetition_penalty = {self.repetition_penalty!r}: the "
                             "in-process α takes log α under temperature, top_k and top_p only; leave min_p None "
                             "and repetition_penalty 1 (vLLM's processed log-probs include them)")


def compute_dtype(args: trl.GRPOConfig, weights: torch.dtype) -> torch.dtype:
    """The dtype the trainer's forwards compute in: bfloat16 or float16 under the recipe's mixed precision
    (``args.bf16`` / ``args.fp16``: autocast over the float32 weights TRL loads), else the weights' ``weights``.
    The colocated engine runs in it (:func:`_engine_arguments`) and the sync audit's τ is its."""
    return torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else weights


@contextlib.contextmanager
def _engine_arguments(trainer: trl.GRPOTrainer, enforce_eager: bool) -> Iterator[None]:
    """TRL builds the colocated ``vllm.LLM`` itself, with no ``dtype`` and no ``enforce_eager``: add them to
    that one construction by patching the module's ``LLM`` (see :mod:`grpo_lab.scale.trl_surface`; a no-op
    without vLLM).

    ``dtype`` = the policy's compute dtype (:func:`compute_dtype`): bfloat16 under a bfloat16 recipe, as the
    trainer's forwards, whatever the float32 weights TRL loads; the weights' dtype without mixed precision,
    where left to itself vLLM would run a float32 checkpoint in bfloat16 (float16 on GPUs), so log α would come
    from another precision than log π_θ (the gap at lag 0 is in docs/benchmarks.md, vLLM section).
    ``trainer.args`` and ``trainer.model`` exist by the time TRL builds the engine.
    """
    import trl.generation.vllm_generation as generation

    if not hasattr(generation, "LLM"):
        yield
        return
    original = generation.LLM

    def build(*args: Any, **engine_args: Any) -> Any:
        engine_args.setdefault("dtype", compute_dtype(trainer.args, trainer.model.dtype))
        if enforce_eager:
            engine_args.setdefault("enforce_eager", True)
        return original(*args, **engine_args)

    generation.LLM = build
    try:
        yield
    finally:
        generation.LLM = original


class _SkipEmptyStep(TrainerCallback):
    """Drops the gradients before each optimiser step of a step whose plan skips
    (:attr:`grpo_lab.plan.StepPlan.skipped`: no signal and ``empty_step="skip"``), so the
    step changes nothing (not even Adam's moments). Under DeepSpeed the engine steps
    inside ``backward`` and the step is only recorded as skipped."""

    def __init__(self, trainer: OffPolicyGRPOTrainer) -> None:
        self.trainer = trainer

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        plan = self.trainer._plan
        if plan is not None and plan.skipped:
            optimizer.zero_grad(set_to_none=True)


class OffPolicyGRPOTrainer(trl.GRPOTrainer):
    """``GRPOTrainer`` running Algorithm 1 with lag v (see the module docstring).

    Example (the bundled SmolLM2 on CPU, α synced every v = 3 steps)::

        from datasets import Dataset
        from grpo_lab.scale.launch import stop_token_ids, verifiable_reward
        from grpo_lab.lm.models import bundled_model_dir
        from grpo_lab.lm.tasks import chat_messages, load_problems
        from grpo_lab.scale.trl import OffPolicyGRPOConfig, OffPolicyGRPOTrainer

        problems = load_problems("add1", 32, seed=0)
        dataset = Dataset.from_list([{"prompt": chat_messages(p), "answer": p.answer,
                                      "answer_format": p.answer_format} for p in problems])
        args = OffPolicyGRPOConfig(output_dir="runs/trl_v3", vllm_sync_interval=3, num_generations=4,
                                   per_device_train_batch_size=8, max_completion_length=8, max_steps=6,
                                   use_cpu=True, report_to="none", save_strategy="no")
        model = str(bundled_model_dir())
        reward = verifiable_reward(eos_token_ids=stop_token_ids(model))
        trainer = OffPolicyGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset)
        trainer.train()
        print(trainer.sync_steps)  # [0, 3]

    ``python -m grpo_lab.scale.launch --config R`` builds the same from a recipe
    (:func:`grpo_lab.scale.launch.trl_args`).

    ================== ==========================================================
    attribute          meaning
    ================== ==========================================================
    ``alpha_model``    the in-process sampler α (``use_vllm=False`` only)
    ``sync_schedule``  the lab's schedule (:func:`grpo_lab.schedules.make_sync_schedule`)
    ``sync_steps``     the steps k at which α ← π_θ happened (this process)
    ================== ==========================================================
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        config = kwargs.get("args")
        with _engine_arguments(self, enforce_eager=bool(getattr(config, "vllm_enforce_eager", False))):
            super().__init__(*args, **kwargs)
        if not isinstance(self.args, OffPolicyGRPOConfig):
            raise ValueError(f"args must be an OffPolicyGRPOConfig, got {type(self.args).__name__}")
        self.sync_steps: list[int] = []
        self.sync_schedule = make_sync_schedule(self.args.sync, self.args.vllm_sync_interval,
                                                self.args.sync_threshold)
        self._drift = [0.0, 0.0]  # Σ |log π_k − log α| and tokens of this step, over micro-batches and processes
        self._rewards: torch.Tensor | None = None
        self._plan_config = validate_trl_values(self.args)  # the lab's GRPOConfig of these knobs, for plan_step
        self._plan: StepPlan | None = None  # the plan of the last training step
        self._objective: ObjectiveArgs | None = None  # the loss's knobs, from the plan of the batch being trained
        self._pending_sync: tuple[bool, float, float, float] | None = None  # (synced, sync s, audit s, proved)
        self.alpha_model = None if self.use_vllm else self._make_alpha()
        self._audit = self._make_audit()
        self._probe: dict[str, torch.Tensor] | None = None  # the audit's probe: a few tokens of a batch after a sync
        self.add_callback(_SkipEmptyStep(self))
        if self.use_vllm and self.vllm_mode == "server" and self.accelerator.is_main_process:
            mode = self.vllm_generation.vllm_client.get_server_info()["model_config"]["logprobs_mode"]
            if mode != "processed_logprobs":  # log α must be at the sampling temperature, like log π
                raise ValueError(f"the vLLM server runs with --logprobs-mode {mode}; restart it with "
                                 "--logprobs-mode processed_logprobs")

    def _make_alpha(self) -> torch.nn.Module:
        """A frozen copy of π_θ. Its forward is re-patched with TRL's fused LM head: the
        deep-copied patch would still call the *original* model's forward."""
        if self._dist.is_zero3 or self._dist.is_fsdp or hasattr(self.model, "peft_config"):
            raise ValueError("use_vllm = False keeps a full in-process copy α; it supports single-process "
                             "and DDP training of a full model, not ZeRO-3, FSDP or PEFT (use vLLM there)")
        alpha = copy.deepcopy(self.accelerator.unwrap_model(self.model)).eval().requires_grad_(False)
        alpha.__dict__.pop("forward", None)
        add_fused_lm_head(alpha, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)
        return alpha

    def _make_audit(self) -> SyncAudit | None:
        """The sync audit (``sync_audit``; :mod:`grpo_lab.sync_audit`) where α can score given tokens: the
        in-process copy, or vLLM colocated without sleep mode. A server cannot be asked through TRL's client, and
        a sleeping engine holds no weights between generations (TRL re-pushes them at every wake-up): there it
        warns once and the run goes unaudited. τ is that of the forward's dtype (bf16/fp16 autocast counts)."""
        if not self.args.sync_audit:
            return None
        if self.use_vllm and (self.vllm_mode == "server" or self.args.vllm_enable_sleep_mode):
            warnings.warn("sync_audit: a vLLM server, or an engine in sleep mode, cannot score the audit's probe "
                          "between generations; this run's syncs are not checked", stacklevel=3)
            return None
        return SyncAudit.for_dtype(compute_dtype(self.args, self.accelerator.unwrap_model(self.model).dtype))

    # TRL pushes π_θ to vLLM wherever ``global_step != _last_loaded_step`` (the only guard of its
    # pushes; tests/test_trl.py checks TRL still works this way): reading global_step back disarms it.
    @property
    def _last_loaded_step(self) -> int:
        return self.state.global_step

    @_last_loaded_step.setter
    def _last_loaded_step(self, value: int) -> None:
        pass  # TRL's per-step push is replaced by _maybe_sync

    def _sync_sampler(self) -> None:
        """α ← π_θ. With vLLM, TRL's push (server or colocate; gathers ZeRO-3/FSDP shards,
        merges PEFT) followed by its prefix-cache reset; else a copy into ``alpha_model``.
        Override this one method for another inference engine."""
        if self.use_vllm and self.vllm_mode == "colocate" and not (self._dist.is_zero3 or self._dist.is_fsdp
                                                                    or hasattr(self.model, "peft_config")):
            # One push (VLLMSampler's adapter, which keeps a tied LM head tied), not TRL's per-tensor
            # ``model.load_weights``: the CPU build repacks its matrices after loading, and that fails there.
            from ..lm.sampling_vllm import load_weights_into_vllm

            named = [(name, tensor) for name, tensor in self.vllm_generation._iter_named_params()]
            load_weights_into_vllm(self.vllm_generation.llm, named)
        elif self.use_vllm:
            self.vllm_generation.sync_weights()
        else:
            self.alpha_model.load_state_dict(self.accelerator.unwrap_model(self.model).state_dict())

    @property
    def _k(self) -> int:
        """k, the step of Algorithm 1 being drawn or trained: one generation batch is ``num_iterations``
        optimiser steps of TRL's (``global_step = k · num_iterations`` when it is drawn)."""
        return self.state.global_step // self.num_iterations

    def _maybe_sync(self) -> None:
        """Sync when the schedule says so (always at the first step after start or resume: α is
        unknown), before the batch is sampled; :meth:`_commit_sync` commits it once the batch exists (the
        order of :mod:`grpo_lab.schedules`). The schedule first ends the previous step: it sees the drift that
        step measured, as the step's plan rules (:meth:`grpo_lab.plan.StepPlan.observed_drift`)."""
        k = self._k
        if self._plan is not None:
            total, tokens = self._drift
            self.sync_schedule.end(self._plan.observed_drift(total / tokens if tokens > 0 else None))
        self._drift = [0.0, 0.0]
        synced = self.sync_schedule.begin(k)
        seconds = audit_seconds = proved = 0.0
        if synced:
            start = time.perf_counter()
            self._sync_sampler()
            seconds = time.perf_counter() - start
            proved = self._prove_sync(k)
            audit_seconds = self._audit_sync(k) + time.perf_counter() - start - seconds
        self._pending_sync = (synced, seconds, audit_seconds, proved)

    def _commit_sync(self) -> bool:
        """Once the training batch sampled after this step's sync exists: commit the sync (``mark_synced``;
        a step whose generation failed asks ``begin`` again and re-syncs), and log the step's lag and sync.
        Returns whether this step synced."""
        pending, self._pending_sync = self._pending_sync, None
        if pending is None:
            return False
        (synced, seconds, audit_seconds, proved), k = pending, self._k
        if synced:
            self.sync_schedule.mark_synced(k)
            self.sync_steps.append(k)
        metrics = self._metrics["train"]
        metrics["off_policy/lag"].append(float(self.sync_schedule.lag(k)))
        metrics["off_policy/synced"].append(float(synced))
        metrics["off_policy/sync_seconds"].append(seconds)
        metrics["off_policy/audit_seconds"].append(audit_seconds)
        metrics["off_policy/sync_proved"].append(proved)
        metrics["off_policy/sync_count"].append(float(len(self.sync_steps)))
        return synced

    def _take_probe(self, output: dict[str, Any], sampled: torch.Tensor) -> None:
        """The audit's probe — process 0's first :data:`~grpo_lab.sync_audit.PROBE_TOKENS` sampled tokens of the
        first training batch after a sync, after the last :data:`~grpo_lab.sync_audit.PROBE_CONTEXT` tokens of
        their prompts (:func:`~grpo_lab.sync_audit.probe_span`), the same on every process (a tensor-parallel
        engine needs the same requests on all its ranks) — and its reference scores."""
        if any(key in output for key in FORWARD_KEYS):
            warnings.warn("sync_audit: this model's batches carry more than tokens (images…), which the probe "
                          "does not; this run's syncs are not checked", stacklevel=2)
            self._audit = None
            return
        rows, keep = probe_span(sampled)
        columns = slice(0, keep.shape[1])
        probe = {"prompt_ids": output["prompt_ids"][rows, -PROBE_CONTEXT:],
                 "prompt_mask": output["prompt_mask"][rows, -PROBE_CONTEXT:],
                 "completion_ids": output["completion_ids"][rows, columns],
                 "completion_mask": output["completion_mask"][rows, columns], "sampled": keep}
        (self._probe,) = broadcast_object_list([{key: value.cpu() for key, value in probe.items()}])
        self._audit_sync(self._k)

    def _audit_sync(self, k: int) -> float:
        """The sync audit after the sync of step k (the first time, its reference): log π_θ of the probe's sampled
        tokens from a no-grad forward of the model, log α from α — the copy, or the colocated engine
        (:func:`grpo_lab.lm.sampling_vllm.engine_logprobs`), at T, untruncated. A sync that did not take raises
        :class:`~grpo_lab.sync_audit.SyncError` on every process. Returns its seconds (0 before the probe)."""
        if self._audit is None or self._probe is None:
            return 0.0
        start = time.perf_counter()
        probe = {key: value.to(self.accelerator.device) for key, value in self._probe.items()}
        with torch.no_grad():
            logp_policy = self._logps(self.model, probe)
            logp_alpha = self._logps(self.alpha_model, probe) if self.alpha_model is not None else (
                self._engine_logps(probe))
        sampled, failure = probe["sampled"].bool(), None
        try:
            self._audit.check(logp_policy[sampled], logp_alpha[sampled], k)
        except SyncError as error:
            failure = error
        self._raise_on_every_process(failure, k)
        return time.perf_counter() - start

    def _prove_sync(self, k: int) -> float:
        """The weights' proof after the sync of step k (:mod:`grpo_lab.fingerprint`), on every process: the
        tensors α serves here (the copy's, or this process's colocated engine's through its worker,
        :func:`grpo_lab.lm.sampling_vllm.served_fingerprints`) against this process's π_θ. Returns 1.0 when
        proved, 0.0 where it cannot run: ``sync_audit`` off, a vLLM server, sleep mode, a tensor-parallel engine,
        ZeRO-3, FSDP or PEFT (docs/metrics.md says why). A failure raises ``SyncError`` on every process."""
        vllm_provable = (self.vllm_mode == "colocate" and not self.args.vllm_enable_sleep_mode
                         and self.args.vllm_tensor_parallel_size == 1)
        if not self.args.sync_audit or (self.use_vllm and not vllm_provable) or (
                self._dist.is_zero3 or self._dist.is_fsdp or hasattr(self.model, "peft_config")):
            return 0.0
        failure = None
        try:
            sources = dict(self.accelerator.unwrap_model(self.model).named_parameters(remove_duplicate=False))
            if self.alpha_model is not None:
                prove_local(list(self.alpha_model.named_parameters(remove_duplicate=False)), sources, k)
            else:
                from ..lm.sampling_vllm import served_fingerprints

                served = self.vllm_generation.llm.apply_model(functools.partial(served_fingerprints, step=k))[0]
                prove(served, sources, k)
        except SyncError as error:
            failure = error
        self._raise_on_every_process(failure, k)
        return 1.0

    def _raise_on_every_process(self, failure: SyncError | None, k: int) -> None:
        """Raise ``failure`` here, and a SyncError on every other process, if any process failed an audit."""
        failures = self.accelerator.reduce(torch.tensor([float(failure is not None)], device=self.accelerator.device),
                                           reduction="sum")
        if failure is not None:
            raise failure
        if float(failures) > 0:
            raise SyncError(f"the sync at step {k} did not take on another process (its own error says how)")

    def _engine_logps(self, probe: dict[str, torch.Tensor]) -> torch.Tensor:
        """log α of the probe's completion tokens ``[b, T]`` from the colocated engine (0 after each row's end)."""
        from ..lm.sampling_vllm import engine_logprobs

        prompts = [ids[keep.bool()].tolist() for ids, keep in zip(probe["prompt_ids"], probe["prompt_mask"],
                                                                   strict=True)]
        completions = [ids[keep.bool()].tolist() for ids, keep in zip(probe["completion_ids"],
                                                                      probe["completion_mask"], strict=True)]
        out = torch.zeros(probe["completion_ids"].shape, dtype=torch.float32, device=probe["completion_ids"].device)
        for row, values in enumerate(engine_logprobs(self.vllm_generation.llm, prompts, completions, self.temperature)):
            out[row, :len(values)] = torch.tensor(values, device=out.device)
        return out

    def _generate(self, prompts: list) -> tuple:
        if self.model.training:
            self._maybe_sync()
        if self.use_vllm:
            return super()._generate(prompts)
        policy, self.model_wrapped = self.model_wrapped, self.alpha_model
        try:
            return super()._generate(prompts)
        finally:
            self.model_wrapped = policy

    def _calculate_rewards(self, inputs: list, prompts: list, completions: list,
                           completion_ids_list: list) -> torch.Tensor:
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        self._rewards = torch.where(torch.isnan(rewards_per_func).all(dim=1), torch.nan, rewards)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list) -> dict[str, Any]:
        """TRL's batch, then the step plan of the batch gathered over every process (the paper's
        advantages, the zero-variance mask, the loss weights, the empty-step decision), this
        process's rows of it, and (without vLLM) log α of the sampled tokens from the copy α."""
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        n, T = output["completion_ids"].shape
        rows = slice(self.accelerator.process_index * n, (self.accelerator.process_index + 1) * n)
        device = output["completion_ids"].device
        sampled = output["completion_mask"].bool()  # the tokens α sampled
        if "tool_mask" in output:
            sampled &= output["tool_mask"].bool()
        everywhere = self.accelerator.gather(self.accelerator.pad_across_processes(sampled.to(torch.int32), dim=1))
        plan = plan_step(self._rewards.view(-1, G).cpu(), everywhere.bool(), self._plan_config, dtype=torch.float32)
        self._logs["advantages"].extend(plan.advantages.tolist())  # replaces TRL's in the completions table
        output["advantages"] = plan.advantages[rows].to(device)
        output["loss_mask"], output["sampled_mask"] = plan.mask[rows, :T].to(device), sampled
        output["loss_weights"] = self._global_loss_weights(plan, rows, T)
        self._objective = plan.objective
        if mode == "train":
            self._plan = plan
        self._metrics[mode]["off_policy/masked_frac"].append(plan.masked_frac)
        self._metrics[mode]["off_policy/skipped"].append(float(plan.skipped))
        if not self.use_vllm:
            with torch.no_grad():
                output["sampling_per_token_logps"] = self._alpha_logps(output, sampled)
        if mode == "train":
            synced = self._pending_sync is not None and self._pending_sync[0]
            if synced and self._audit is not None and self._probe is None:
                self._take_probe(output, sampled)
            self._commit_sync()
        return output

    def _alpha_logps(self, inputs: dict[str, Any], sampled: torch.Tensor) -> torch.Tensor:
        """log α of the sampled tokens under the copy α, from the distribution ``generate`` drew them from.

        Untruncated, TRL's fused scoring forward at T (log π's). With ``top_k`` / ``top_p``, log α′: the copy's
        plain forward, one micro-batch of rows at a time (the cut needs every logit), at T, cut by
        :func:`grpo_lab.lm.sampling.truncate_logprobs` (Hugging Face's warpers' set) and renormalised; the
        tokens α did not sample, which the cut may give probability 0, get NaN (so r′ = 1 in
        :meth:`_compute_loss`, as for tokens vLLM did not score).
        """
        if not cuts(self.args.top_p, self.args.top_k, self.alpha_model.get_output_embeddings().weight.shape[0]):
            return self._logps(self.alpha_model, inputs)
        if any(key in inputs for key in FORWARD_KEYS):
            raise ValueError("top_p / top_k on the in-process α score text-only models; use vLLM for this model")
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        rows, logps = self.args.per_device_train_batch_size, []
        for part in (slice(start, start + rows) for start in range(0, len(input_ids), rows)):
            with self.accelerator.autocast():
                logits = self.alpha_model(input_ids=input_ids[part], attention_mask=attention_mask[part],
                                          logits_to_keep=completion_ids.shape[1] + 1).logits[:, :-1]
            logp = truncate_logprobs(torch.log_softmax(logits.float() / self.temperature, dim=-1), self.args.top_p,
                                     self.args.top_k)
            logps.append(logp.gather(-1, completion_ids[part, :, None]).squeeze(-1))
        return torch.cat(logps).masked_fill(~sampled, float("nan"))

    def _global_loss_weights(self, plan: StepPlan, rows: slice, T: int) -> torch.Tensor:
        """This process's rows of the plan's weights (normalised over the generation batch of *all*
        processes), times the number of processes: DDP averages the gradients over them."""
        return plan.weights[rows, :T] * self.accelerator.num_processes

    def _logps(self, model: torch.nn.Module, inputs: dict[str, Any],
               compute_entropy: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs (and entropies) of the completions under ``model`` at temperature T."""
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, inputs["completion_ids"].shape[1],
            batch_size=self.args.per_device_train_batch_size, compute_entropy=compute_entropy,
            **{key: inputs[key] for key in FORWARD_KEYS if key in inputs})
        return (logps, entropies) if compute_entropy else logps

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        """One micro-batch's share of −(L^c_α − β·KL), by :func:`grpo_lab.grpo_objective`.

        ============================ ======= ===========================================
        input                        symbol  source
        ============================ ======= ===========================================
        log-probs, with gradient     log π_θ forward of ``model`` now
        ``old_per_token_logps``      log π_k TRL, when i > 1; else log π_θ detached
        ``sampling_per_token_logps`` log α   vLLM, or the copy α (tokens vLLM could not
                                             score get log α = log π_k, so r′ = 1)
        ``ref_per_token_logps``      log π_ref TRL, when β > 0
        ``loss_weights``             w       :meth:`_global_loss_weights`
        ============================ ======= ===========================================
        """
        logp, entropies = self._logps(model, inputs, compute_entropy=True)
        logp_k = inputs.get("old_per_token_logps", logp.detach())
        logp_alpha = inputs["sampling_per_token_logps"]
        logp_alpha = torch.where(torch.isnan(logp_alpha), logp_k, logp_alpha)
        loss, metrics = grpo_objective(
            logp, logp_alpha, inputs["advantages"], inputs["loss_weights"], logp_k=logp_k,
            logp_ref=inputs.get("ref_per_token_logps"), **self._objective.kwargs())
        tv = tv_terms(logp_k, logp_alpha, inputs["sampled_mask"])
        self._log_loss_metrics(metrics, entropies, inputs["loss_mask"], tv)
        self._log_ratio_diagnostics(logp_k, logp_alpha, inputs["sampled_mask"])
        return loss

    def _log_ratio_diagnostics(self, logp_k: torch.Tensor, logp_alpha: torch.Tensor, sampled: torch.Tensor) -> None:
        """:func:`grpo_lab.objective.ratio_diagnostics` of this micro-batch gathered over all processes
        (the step's when one micro-batch holds it), before any clip, cap or mask."""
        mode = "train" if self.model.training else "eval"
        acc = self.accelerator
        gathered = [acc.gather(acc.pad_across_processes(x.detach().contiguous(), dim=1))
                    for x in (logp_k, logp_alpha, sampled.to(torch.int32))]
        diagnostics = ratio_diagnostics(*gathered[:2], gathered[2].bool(), self._objective.is_correction,
                                        self._objective.is_cap, self._objective.is_floor, self._objective.is_level)
        for name in RATIO_DIAGNOSTICS:
            self._metrics[mode][f"off_policy/{name}"].append(diagnostics[name])

    def _log_loss_metrics(self, metrics: dict[str, float], entropies: torch.Tensor, mask: torch.Tensor,
                          tv: torch.Tensor) -> None:
        """Token-weighted means over all processes, the sequence mean of ``tv`` (:func:`tv_terms`)
        and the max of r′ over all processes."""
        mode = "train" if self.model.training else "eval"
        n = metrics["num_tokens"]
        names = [*_MEAN_METRICS, *(["kl"] if "kl" in metrics else [])]
        sums = [metrics[name] * n for name in names] + [float(tv.sum()), float(tv.numel()),
                                                         float((entropies.detach() * mask).sum()), float(n)]
        totals = self.accelerator.reduce(torch.tensor(sums, device=entropies.device), reduction="sum").tolist()
        count = max(totals[-1], 1.0)
        for name, total in zip(names, totals[:-4], strict=True):
            self._metrics[mode][name if name == "kl" else f"off_policy/{name}"].append(total / count)
        self._metrics[mode]["off_policy/tv_estimate"].append(totals[-4] / max(totals[-3], 1.0))
        if mode == "train":  # the same on every process (reduced), so every process takes the same syncs
            self._drift[0] += totals[names.index("log_ratio_k_abs")]
            self._drift[1] += totals[-1]
        self._metrics[mode]["entropy"].append(totals[-2] / count)
        ratio_max = self.accelerator.gather(torch.tensor([metrics["ratio_k_max"]], device=entropies.device))
        self._metrics[mode]["off_policy/ratio_k_max"].append(float(ratio_max.max()))
