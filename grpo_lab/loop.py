"""Algorithm 1 — the (v, i) loop (docs/theory.md §5), written once for every policy.

The bandit, the language models and the benchmarks all run through
:class:`GRPOLoop`. It talks to three small protocols (:mod:`grpo_lab.protocols`):

* :class:`Policy` — a ``torch.nn.Module`` (π_θ) whose ``logprobs`` returns the
  log-probabilities of a rollout's completions, with gradient;
* :class:`Sampler` — holds α: ``sample`` draws G completions per prompt with
  their log α, ``sync(policy)`` replaces α by π_θ;
* :class:`Task` — draws prompts and scores completions with rewards in [0, 1].

One step k::

    if schedule.begin(k): sampler.sync(π_θ)              α ← π_θ, lag = 0; the sync audit checks it took
    prompts ~ task; rollout ~ α (G per prompt, with log α)
    plan = plan_step(rewards [P, G], rollout.mask)       A, m, token weights w, trains?
    the first batch after a sync: the audit's probe      a few of its tokens, scored by π_θ and α
    schedule.mark_synced(k) if it synced                 the sync counts once the batch exists
    if plan.trains: log π_ref (if β > 0), once, no gradient;
        repeat i times: optimiser step on grpo_objective   (pass 0 also gives log π_k)
    schedule.end(plan.observed_drift(drift))
    if ref schedule says so: π_ref ← π_θ
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .checks import require_reward_groups
from .config import RESUME_FREE_FIELDS, GRPOConfig
from .objective import (
    NO_TOKEN_METRICS,
    OFFPOLICY_SPLIT,
    RATIO_DIAGNOSTICS,
    grpo_objective,
    offpolicy_split,
    ratio_diagnostics,
    tv_terms,
)
from .plan import StepPlan, plan_step
from .protocols import Policy, Rollout, Sampler, Task
from .schedules import RefResetSchedule, make_sync_schedule
from .sync_audit import SyncAudit, probe_of


@dataclass
class StepRecord:
    """What one step k measured. ``docs/metrics.md`` explains each field."""

    step: int
    lag: int
    synced: bool
    skipped: bool
    reward_mean: float
    masked_frac: float
    loss: float
    clip_low_frac: float
    clip_high_frac: float
    ratio_k_mean: float
    ratio_k_max: float
    log_ratio_k_abs: float
    tv_estimate: float
    kl: float
    grad_norm: float
    num_tokens: int
    sync_bytes: int
    sample_seconds: float
    train_seconds: float
    sync_seconds: float
    ref_reset: bool
    ess_token: float = 1.0
    ess_seq: float = 1.0
    ess_token_applied: float = 1.0
    log_ratio_k_min: float = 0.0
    log_ratio_k_p50: float = 0.0
    log_ratio_k_p99: float = 0.0
    log_ratio_k_max: float = 0.0
    log_weight_min: float = 0.0
    log_weight_p50: float = 0.0
    log_weight_p99: float = 0.0
    log_weight_max: float = 0.0
    cap_frac: float = 0.0
    drop_frac: float = 0.0
    """The :func:`~grpo_lab.objective.ratio_diagnostics` of the step's sampled tokens (defaults: an on-policy
    step's values, for histories saved before these fields existed)."""
    audit_seconds: float = 0.0
    staleness_abs: float = 0.0
    mismatch_abs: float = 0.0
    staleness_share: float = 0.0
    """The sync audit's time and the :func:`~grpo_lab.objective.offpolicy_split` (0 with
    ``offpolicy_split`` off; defaults for histories saved before these fields existed)."""
    weights_audit: str = ""
    probe_audit: str = ""
    """The sync audit's verdicts at a sync ("" at steps without one): the weights' proof (``"proved"`` /
    ``"off"``) and the behavioural probe's (:meth:`~grpo_lab.sync_audit.SyncAudit.check`); a failed one raises
    ``SyncError`` instead (docs/metrics.md)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@contextlib.contextmanager
def deferred_interrupt(note: str) -> Iterator[None]:
    """Hold Ctrl-C / a notebook's interrupt until the block ends, so a step is
    applied whole or not at all. Off the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[Any] = []

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        print(f"interrupt received: {note}")

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


def make_optimizer(params: Any, config: GRPOConfig) -> torch.optim.Optimizer:
    """AdamW (default) or SGD over the policy's trainable parameters.

    AdamW is torch's fused kernel (as TRL's default ``adamw_torch_fused``): one pass over
    each parameter's four tensors instead of a loop over them.
    """
    params = [p for p in params if p.requires_grad]
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, fused=True)


def optimizer_step(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], config: GRPOConfig,
                   named_parameters: Callable[[], Iterable[tuple[str, torch.Tensor]]], where: str) -> float:
    """The loop's optimiser step on ``params``' gradients: clip to ``config.max_grad_norm`` (if set), then step.
    A non-finite gradient raises first, naming ``where`` and its parameter (from ``named_parameters``), so the
    parameters and the optimiser state stay as they were. Returns the gradient norm before clipping."""
    params = [p for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])  # one foreach pass over the gradients
    if not torch.isfinite(norm):
        names = {id(p): name for name, p in named_parameters()}
        bad = [names.get(id(p), f"#{j}") for j, p in enumerate(params) if not torch.isfinite(p.grad).all()]
        raise FloatingPointError(f"non-finite gradient norm {norm.item()} {where} "
                                 f"(non-finite gradients: {bad[:3] or 'none; their norm overflowed'})")
    if config.max_grad_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(params, config.max_grad_norm, norm)
    optimizer.step()
    return float(norm)


class GRPOLoop:
    """Runs Algorithm 1 on (policy, sampler, task) and keeps everything needed to resume.

    State: ``k`` (next step), π_θ (``policy``), α (``sampler``), π_ref
    (``reference``, only when β > 0), the optimiser, the schedules, the random
    generator and ``history`` (one :class:`StepRecord` per finished step). A step
    is all-or-nothing: an exception while sampling leaves every piece as it was;
    an interrupt during the optimiser passes is held until the step is complete.
    """

    def __init__(self, policy: Policy, sampler: Sampler, task: Task, config: GRPOConfig,
                 run_ids: torch.Tensor | None = None, micro_batch_size: int | None = None) -> None:
        self.policy, self.sampler, self.task, self.config = policy, sampler, task, config
        self.run_ids = run_ids
        self.micro_batch_size = micro_batch_size or config.micro_batch_size
        """Rows per forward and backward (None: the whole batch): the config's, or the memory plan's on a device
        where the config's does not fit; the sum over micro-batches is exact either way."""
        self.optimizer = make_optimizer(policy.parameters(), config)
        self._params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.schedule = make_sync_schedule(config.sync, config.v, config.sync_threshold)
        self.ref_schedule = RefResetSchedule(config.ref_period)
        self.reference = self._frozen_copy(policy) if config.beta > 0 else None
        self.generator = torch.Generator().manual_seed(config.seed)
        self.k = 0
        self.history: list[StepRecord] = []
        if config.offpolicy_split and not callable(getattr(sampler, "synced_logprobs", None)):
            raise ValueError(f"offpolicy_split = True needs log π_sync, but {type(sampler).__name__} has no "
                             "synced_logprobs (see grpo_lab.protocols.ScoringSampler)")
        self.audit: SyncAudit | None = None
        if config.sync_audit and callable(getattr(sampler, "score", None)):
            # τ of the dtype π_θ's forward computes in (an LMPolicy's autocast dtype, else its weights')
            self.audit = SyncAudit.for_dtype(getattr(policy, "compute_dtype", None)
                                             or next(iter(policy.parameters())).dtype)
        elif config.sync_audit:
            warnings.warn(f"{type(sampler).__name__} has no score(rollout, rows), so the sync audit cannot run: "
                          "this run's syncs are not checked (sync_audit=False silences this)", stacklevel=2)
        self._probe: Rollout | None = None  # the audit's probe: a few tokens of a batch sampled after a sync

    @staticmethod
    def _frozen_copy(policy: Policy) -> Policy:
        ref = copy.deepcopy(policy)
        ref.requires_grad_(False)
        return ref

    def run(self, steps: int | None = None) -> Iterator[StepRecord]:
        """Yield the records of the next ``steps`` steps (default: up to ``config.steps``)."""
        last = self.config.steps if steps is None else self.k + steps
        while self.k < last:
            yield self.step()

    def step(self) -> StepRecord:
        """Run step k and return its record."""
        cfg, k = self.config, self.k
        rng_state = self.generator.get_state()
        try:
            synced, sync_bytes, sync_seconds, audit_seconds = self.schedule.begin(k), 0, 0.0, 0.0
            verdicts = {"weights_audit": "", "probe_audit": ""}
            if synced:
                start = time.perf_counter()
                sync_bytes = self.sampler.sync(self.policy)
                sync_seconds = time.perf_counter() - start
                verdicts["weights_audit"], seconds = self._prove(k)
                verdicts["probe_audit"], audit_seconds = self._audit(k)
                audit_seconds += seconds

            start = time.perf_counter()
            prompts = self.task.prompts(cfg.prompts_per_step, self.generator)
            if len(prompts) == 0:
                raise ValueError(f"task returned no prompts at step {k}")
            rollout = self.sampler.sample(prompts, cfg.G, self.generator)
            rewards = require_reward_groups(self.task.rewards(rollout, self.generator))
            if rewards.shape != (len(prompts), cfg.G):
                raise ValueError(f"rewards must have shape [P, G] = [{len(prompts)}, {cfg.G}], "
                                 f"got {tuple(rewards.shape)}")
            sample_seconds = time.perf_counter() - start
            plan = self.plan(rollout, rewards)
            if self.audit is not None and self._probe is None and synced:  # the audit's probe and reference
                self._probe = probe_of(rollout)
                verdicts["probe_audit"], seconds = self._audit(k)
                audit_seconds += seconds
        except BaseException:
            self.generator.set_state(rng_state)
            raise
        # α is now π_{k0}; commit the sync only once the batch exists, so an
        # interrupted sampling step re-syncs (idempotent) when run again.
        if synced:
            self.schedule.mark_synced(k)
        lag = self.schedule.lag(k)

        with deferred_interrupt(f"finishing step {k} so that π_θ, α and the optimiser stay consistent"):
            start = time.perf_counter()
            metrics, loss, grad_norm = self._train(rollout, plan)
            ref_reset = self.reference is not None and self.ref_schedule.should_reset(k)
            if ref_reset:
                self.reference.load_state_dict(self.policy.state_dict())
            train_seconds = time.perf_counter() - start
            self.schedule.end(plan.observed_drift(metrics["log_ratio_k_abs"]))
            record = StepRecord(
                step=k, lag=lag, synced=synced, skipped=plan.skipped,
                reward_mean=float(rewards.mean()), masked_frac=plan.masked_frac, loss=loss,
                clip_low_frac=metrics["clip_low_frac"], clip_high_frac=metrics["clip_high_frac"],
                ratio_k_mean=metrics["ratio_k_mean"], ratio_k_max=metrics["ratio_k_max"],
                log_ratio_k_abs=metrics["log_ratio_k_abs"], tv_estimate=metrics["tv_estimate"],
                kl=metrics.get("kl", 0.0),
                grad_norm=grad_norm, num_tokens=metrics["num_tokens"], sync_bytes=sync_bytes,
                sample_seconds=sample_seconds, train_seconds=train_seconds,
                sync_seconds=sync_seconds, ref_reset=ref_reset, audit_seconds=audit_seconds, **verdicts,
                **{name: metrics[name] for name in RATIO_DIAGNOSTICS},
                **{name: metrics[name] for name in OFFPOLICY_SPLIT if name in metrics})
            self.history.append(record)
            self.k = k + 1
        return record

    def _prove(self, k: int) -> tuple[str, float]:
        """The weights' proof after the sync of step k (the sampler's ``prove_sync``, :mod:`grpo_lab.fingerprint`;
        raises ``SyncError``): its verdict (``"proved"``, or ``"off"`` with the audit off or a sampler that
        cannot prove) and seconds."""
        prove_sync = getattr(self.sampler, "prove_sync", None)
        if not self.config.sync_audit or not callable(prove_sync):
            return "off", 0.0
        start = time.perf_counter()
        prove_sync(self.policy, k)
        return "proved", time.perf_counter() - start

    def _audit(self, k: int) -> tuple[str, float]:
        """The sync audit on the probe (:class:`~grpo_lab.sync_audit.SyncAudit`; raises its ``SyncError``): one
        no-grad forward of π_θ and one of the sampler. Returns its verdict and seconds (``"off"`` and 0 with no
        audit, ``"no probe yet"`` and 0 before the first batch after a sync)."""
        if self.audit is None:
            return "off", 0.0
        if self._probe is None:
            return "no probe yet", 0.0
        start = time.perf_counter()
        probe, everything = self._probe, slice(None)
        with torch.no_grad():
            logp_policy = self.policy.logprobs(probe, everything)
            logp_alpha = self.sampler.score(probe, everything)
        verdict = self.audit.check(logp_policy[probe.mask], logp_alpha[probe.mask], k)
        return verdict, time.perf_counter() - start

    def plan(self, rollout: Rollout, rewards: torch.Tensor) -> StepPlan:
        """:func:`~grpo_lab.plan.plan_step` of a sampled batch: this loop's config and stacked runs,
        weights in log α's dtype."""
        return plan_step(rewards, rollout.mask, self.config, self.run_ids, dtype=rollout.logp_alpha.dtype)

    def _train(self, rollout: Rollout, plan: StepPlan) -> tuple[dict[str, float], float, float]:
        """The i optimiser passes of one step (micro-batched, exact), or none when ``plan.trains``
        is False.

        Returns the metrics averaged over the passes (clip fractions are 0 at
        pass 0, where π_θ = π_k) with ``tv_estimate`` and the :func:`ratio_diagnostics` of every
        sampled token, the mean loss and the last gradient norm (0 when nothing trained).
        """
        cfg = self.config
        B = rollout.completions.shape[0]
        size = self.micro_batch_size or B
        chunks = [slice(s, min(s + size, B)) for s in range(0, B, size)]
        # Rows whose every weight is 0 (masked groups) need no gradient: one no-grad forward gives their log π_k.
        trained = [rows for rows in chunks if bool((plan.weights[rows] > 0).any())] if plan.trains else []
        all_logp_k = torch.empty_like(rollout.logp_alpha)  # log π_k of every sampled row, for the diagnostics
        if not plan.trains and cfg.empty_step == "skip_after_backward":
            self._backward_dropped(rollout, plan, chunks, all_logp_k)
            return {**NO_TOKEN_METRICS, **self._sample_diagnostics(rollout, plan, all_logp_k, chunks)}, 0.0, 0.0
        for rows in chunks:
            if rows not in trained:
                with torch.no_grad():
                    all_logp_k[rows] = self.policy.logprobs(rollout, rows)
        if not plan.trains:
            return {**NO_TOKEN_METRICS, **self._sample_diagnostics(rollout, plan, all_logp_k, chunks)}, 0.0, 0.0

        logp_ref = None
        if self.reference is not None:
            with torch.no_grad():
                logp_ref = [self.reference.logprobs(rollout, rows) for rows in trained]
        logp_k: list[torch.Tensor | None] = [None] * len(trained)
        loss_sum, parts = 0.0, []
        for pass_index in range(cfg.i):
            for param in self._params:  # = optimizer.zero_grad(set_to_none=True), without its per-call overhead
                param.grad = None
            for c, rows in enumerate(trained):
                logp = self.policy.logprobs(rollout, rows)
                if pass_index == 0:
                    logp_k[c] = all_logp_k[rows] = logp.detach()  # π_θ = π_k before the first optimiser step
                loss, metrics = grpo_objective(
                    logp, rollout.logp_alpha[rows], plan.advantages[rows], plan.weights[rows], logp_k=logp_k[c],
                    logp_ref=None if logp_ref is None else logp_ref[c], **plan.objective.kwargs())
                loss_value = float(loss.detach())
                if not math.isfinite(loss_value):
                    raise FloatingPointError(f"non-finite loss {loss_value} at step {self.k}, pass {pass_index}")
                loss.backward()
                loss_sum += loss_value
                parts.append(metrics)
            if not trained:  # empty_step="optimizer_step" and no counted token: step on a zero gradient
                for param in self._params:
                    param.grad = torch.zeros_like(param)
            grad_norm = optimizer_step(self.optimizer, self._params, cfg, self.policy.named_parameters,
                                       f"at step {self.k}")
            for param in self._params:  # used: free them (W_train), not held between steps or by a finished loop
                param.grad = None
        metrics = merge_metrics(parts) if parts else dict(NO_TOKEN_METRICS)
        return {**metrics, **self._sample_diagnostics(rollout, plan, all_logp_k, chunks)}, loss_sum / cfg.i, grad_norm

    def _backward_dropped(self, rollout: Rollout, plan: StepPlan, chunks: list[slice],
                          all_logp_k: torch.Tensor) -> None:
        """``empty_step="skip_after_backward"`` on a skipped step: the i passes of forward (π_ref's too, with β > 0)
        and backward a trained step runs, over every row, then the gradients are dropped and no optimiser step
        is taken, so θ and the optimiser's state end as under ``skip``. Fills ``all_logp_k`` (log π_k)."""
        for _ in range(self.config.i):
            for rows in chunks:
                logp_ref = None
                if self.reference is not None:
                    with torch.no_grad():
                        logp_ref = self.reference.logprobs(rollout, rows)
                logp = self.policy.logprobs(rollout, rows)
                all_logp_k[rows] = logp.detach()
                loss, _ = grpo_objective(logp, rollout.logp_alpha[rows], plan.advantages[rows], plan.weights[rows],
                                         logp_ref=logp_ref, **plan.objective.kwargs())
                loss.backward()
            for param in self._params:
                param.grad = None

    def _sample_diagnostics(self, rollout: Rollout, plan: StepPlan, logp_k: torch.Tensor,
                            chunks: list[slice]) -> dict[str, float]:
        """``tv_estimate`` and the :func:`ratio_diagnostics` over every sampled token (masked groups
        included), raw and as ``is_correction`` applies them. With
        ``offpolicy_split``, the :func:`offpolicy_split` too: log π_sync from the sampler, by micro-batch."""
        tv = float(tv_terms(logp_k, rollout.logp_alpha, rollout.mask).mean())
        split = {}
        if self.config.offpolicy_split:
            with torch.no_grad():
                logp_sync = torch.cat([self.sampler.synced_logprobs(rollout, rows) for rows in chunks])
            split = offpolicy_split(logp_k, logp_sync, rollout.logp_alpha, rollout.mask)
        ratios = ratio_diagnostics(logp_k, rollout.logp_alpha, rollout.mask, plan.objective.is_correction,
                                   plan.objective.is_cap, plan.objective.is_floor, plan.objective.is_level)
        return {"tv_estimate": tv, **ratios, **split}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: tensors and plain Python values only."""
        return {
            "k": self.k,
            "config": self.config.to_dict(),
            "policy": self.policy.state_dict(),
            "sampler": self.sampler.state_dict(),
            "reference": None if self.reference is None else self.reference.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "generator": self.generator.get_state(),
            "history": [r.to_dict() for r in self.history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`. A config field the checkpoint lacks (it predates the field) counts
        as the field's default, and history records lacking :class:`StepRecord` fields get theirs."""
        current = self.config.to_dict()
        defaults = {f.name: f.default for f in dataclasses.fields(self.config) if f.default is not dataclasses.MISSING}
        saved = {**defaults, **state["config"]}
        changed = {k: (v, current.get(k)) for k, v in saved.items()
                   if current.get(k) != v and k not in RESUME_FREE_FIELDS}
        if changed:
            raise ValueError(f"checkpoint was written with a different config (saved, current): {changed}")
        self.policy.load_state_dict(state["policy"])
        self.sampler.load_state_dict(state["sampler"])
        if self.reference is not None:
            self.reference.load_state_dict(state["reference"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        self.generator.set_state(state["generator"])
        self.history = [StepRecord(**r) for r in state["history"]]
        self.k = int(state["k"])
        self._probe = None  # α was restored, not synced: the audit starts again after the next sync
        if self.audit is not None:
            self.audit.reset()


def merge_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Combine micro-batch metrics: token-weighted means, max of maxima, summed counts."""
    total = sum(p["num_tokens"] for p in parts)
    merged: dict[str, float] = {"num_tokens": total}
    for key in parts[0]:
        if key == "num_tokens":
            continue
        if key.endswith("_max"):
            merged[key] = max(p[key] for p in parts)
        else:
            merged[key] = sum(p[key] * p["num_tokens"] for p in parts) / max(total, 1)
    return merged
