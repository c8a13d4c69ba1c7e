"""A contextual bandit where every quantity of docs/theory.md §4 is exact (notebook 01).

C contexts play the prompts, K arms the responses; arm k of context c succeeds
with probability p[c, k] (reward 1, else 0). The policy is a tabular softmax
with logits ``[R, C, K]``: R independent runs (seeds) stacked, trained in one
batched computation through the same :class:`~grpo_lab.loop.GRPOLoop` as the
language models. The sampler is a lagged copy of those logits, so a sync is a
real tensor copy.

Because π, π_k and α are explicit tables, J, L_α, TV and Theorem 1's bound are
computed exactly (no sampling), vectorised over any leading dimensions.

The live panel of notebook 01 re-runs with :mod:`grpo_lab.exact.closed_form`: the same
steps and random draws, with the gradient written in closed form.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from ..checks import require_choice, require_int_at_least, require_number_in
from ..config import GRPOConfig
from ..loop import GRPOLoop
from ..objective import KL_KINDS
from ..protocols import Rollout

MAX_EPS_STD = 0.75  # keeps σ = sqrt(σ² + ε_std) <= 1, where Theorem 1's weight (1−σ)/σ is >= 0


# ----------------------------------------------------------------------------- exact quantities

def J(pi: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Expected reward per context, J(π)(x) = Σ_y π(y|x) p(x, y).

    ``pi [..., C, K]`` probabilities, ``p [C, K]`` success probabilities → ``[..., C]``.
    """
    return (pi * p).sum(dim=-1)


def sigma_alpha(alpha: torch.Tensor, p: torch.Tensor, eps_std: float) -> torch.Tensor:
    """σ_{α,r,ε}(x) = sqrt(Var_{y~α}[r] + ε_std); for 0/1 rewards Var = μ_α(1 − μ_α). ``[..., C]``."""
    mu = J(alpha, p)
    return (mu * (1 - mu) + eps_std).sqrt()


def surrogate_L(pi: torch.Tensor, alpha: torch.Tensor, p: torch.Tensor, eps_std: float) -> torch.Tensor:
    """L_α(π)(x) = E_{y~α}[π/α · A_α(x, y)] = (J(π) − μ_α) / σ_α, exactly. ``[..., C]``.

    A_α(x, y) = (r − μ_α(x)) / σ_α(x) with the exact mean and variance of the
    reward under α; where σ = 0 (a context whose arms all pay the same and
    ε_std = 0) the advantage is 0 and so is L.
    """
    sigma = sigma_alpha(alpha, p, eps_std)
    gap = J(pi, p) - J(alpha, p)
    return torch.where(sigma > 0, gap / torch.where(sigma > 0, sigma, torch.ones_like(sigma)), torch.zeros_like(gap))


def tv(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total-variation distance ½ Σ_y |p(y) − q(y)| over the last dimension."""
    return 0.5 * (p - q).abs().sum(dim=-1)


def bound_weight(alpha: torch.Tensor, p: torch.Tensor, eps_std: float) -> torch.Tensor:
    """(1 − σ)/σ, Theorem 1's data-dependent weight on TV(π, α); → ∞ as μ_α → 0 or 1."""
    sigma = sigma_alpha(alpha, p, eps_std)
    return (1 - sigma) / sigma


def improvement_lower_bound(pi: torch.Tensor, pi_k: torch.Tensor, alpha: torch.Tensor, p: torch.Tensor,
                            eps_std: float) -> torch.Tensor:
    """Right-hand side of Theorem 1 (docs/theory.md §4), per context ``[..., C]``::

        L_α(π) − 2 (1 − σ)/σ · TV(π, α) − 2 TV(π_k, α)

    Valid for rewards in [0, 1] and 0 < σ <= 1, i.e. ``0 < eps_std <= 0.75``
    (or eps_std = 0 where μ_α is not 0 or 1). With α = π_k it is Corollary 1. For these 0/1 rewards it is
    ≤ 0 unless μ_α(1 − μ_α) > ¼ − ε_std (σ > ½), and never above 4·ε_std·TV(π, α) (docs/theory.md §4).
    """
    require_number_in("eps_std", eps_std, 0.0, MAX_EPS_STD)
    return (surrogate_L(pi, alpha, p, eps_std) - 2 * bound_weight(alpha, p, eps_std) * tv(pi, alpha)
            - 2 * tv(pi_k, alpha))


def kl_expected_gradient(pi: torch.Tensor, pi_ref: torch.Tensor, alpha: torch.Tensor, kind: str,
                         weighted: bool = False, differentiable: bool = False) -> torch.Tensor:
    """The exact expected gradient of a KL estimator used as a loss term, w.r.t. the logits of a
    softmax table (docs/theory.md §3), per context ``[..., C, K]``::

        E_{y~α}[ w(y) · ∂k/∂log π(y) · (onehot(y) − π) ],   w = π/α (detached) if ``weighted`` else 1

    with ∂k1 = 1, ∂k2 = log π − log π_ref, ∂k3 = 1 − π_ref/π (:func:`grpo_lab.kl_estimate`, the
    sample y detached). With α = π or ``weighted``: 0 for k1, ∇KL(π ‖ π_ref) for k2, ∇KL(π_ref ‖ π)
    for k3 (``tests/test_bandit.py`` holds these against autograd of the exact KLs).

    ``differentiable`` (TRL's ``use_bias_correction_kl``, :func:`grpo_lab.objective.kl_weight`): the weight
    w = π/α keeps its gradient, so the slope is w·(k + ∂k) and the expectation ∇_θ E_π[k]: ∇KL(π ‖ π_ref) for
    k1 and k3 at every α, on-policy included.
    """
    require_choice("kind", kind, KL_KINDS)
    if kind == "k1":
        slope = torch.ones_like(pi)
    elif kind == "k2":
        slope = pi.log() - pi_ref.log()
    else:
        slope = 1 - pi_ref / pi
    if differentiable:                                # ∂(w·k)/∂ log π = w·(k + ∂k), w = π/α
        d = pi_ref.log() - pi.log()
        slope = slope + {"k1": -d, "k2": 0.5 * d * d, "k3": torch.expm1(d) - d}[kind]
    q = pi if weighted or differentiable else alpha   # α · (π/α) = π
    weighted_slope = q * slope
    return weighted_slope - weighted_slope.sum(-1, keepdim=True) * pi


def true_improvement(pi: torch.Tensor, pi_k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """J(π) − J(π_k) per context ``[..., C]``: what the bound bounds."""
    return J(pi, p) - J(pi_k, p)


# ----------------------------------------------------------------------------- problem, policy, sampler

@dataclass(frozen=True)
class BanditProblem:
    """Success probabilities ``p [C, K]`` in [0, 1]."""

    p: torch.Tensor

    def __post_init__(self) -> None:
        if self.p.dim() != 2 or min(self.p.shape) < 1:
            raise ValueError(f"p must have shape [C, K] with C, K >= 1, got {tuple(self.p.shape)}")
        if not torch.isfinite(self.p).all() or (self.p < 0).any() or (self.p > 1).any():
            raise ValueError("p must hold probabilities in [0, 1]")

    @property
    def contexts(self) -> int:
        return self.p.shape[0]

    @property
    def arms(self) -> int:
        return self.p.shape[1]

    @classmethod
    def random(cls, contexts: int = 16, arms: int = 8, seed: int = 0, hardness: float = 1.5) -> BanditProblem:
        """Contexts of mixed difficulty: p = sigmoid(2·z − d_c) with z ~ N(0, 1) per arm
        and d_c spread over [−hardness, 2·hardness], so some contexts start near
        p = 0 (all-wrong groups) and some near 1 (all-right groups)."""
        require_int_at_least("contexts", contexts, 1)
        require_int_at_least("arms", arms, 2)
        g = torch.Generator().manual_seed(seed)
        difficulty = torch.linspace(-hardness, 2 * hardness, contexts)[:, None]
        z = torch.randn(contexts, arms, generator=g, dtype=torch.float64)
        return cls(torch.sigmoid(2 * z - difficulty))


class TabularPolicy(torch.nn.Module):
    """π_θ(y|x) = softmax(logits[run, x])_y, logits ``[R, C, K]`` (R stacked runs)."""

    def __init__(self, runs: int, contexts: int, arms: int) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(runs, contexts, arms, dtype=torch.float64))

    def probs(self) -> torch.Tensor:
        return torch.softmax(self.logits.detach(), dim=-1)

    def logprobs(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        run, context = rollout.extra["run"][rows], rollout.extra["context"][rows]
        logp = torch.log_softmax(self.logits[run, context], dim=-1)
        return logp.gather(1, rollout.completions[rows])


class LaggedTabularSampler:
    """The inference server of the bandit: its own copy of the logits (α)."""

    def __init__(self, runs: int, contexts: int, arms: int) -> None:
        self.logits = torch.zeros(runs, contexts, arms, dtype=torch.float64)

    def probs(self) -> torch.Tensor:
        return torch.softmax(self.logits, dim=-1)

    def sync(self, policy: TabularPolicy) -> int:
        self.logits.copy_(policy.logits.detach())
        return self.logits.numel() * self.logits.element_size()

    def draw(self, prompts: torch.Tensor, group_size: int,
             generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """G arms per prompt from α and their log α, both ``[R·P, G]`` (``prompts`` holds R·P contexts, run-major)."""
        runs = self.logits.shape[0]
        run = torch.arange(runs).repeat_interleave(len(prompts) // runs)
        logp_table = torch.log_softmax(self.logits[run, prompts], dim=-1)          # [R·P, K]
        arms = torch.multinomial(logp_table.exp(), group_size, replacement=True, generator=generator)
        return arms, logp_table.gather(1, arms)

    def sample(self, prompts: torch.Tensor, group_size: int, generator: torch.Generator) -> Rollout:
        arms, logp_alpha = self.draw(prompts, group_size, generator)
        run = torch.arange(self.logits.shape[0]).repeat_interleave(arms.numel() // self.logits.shape[0])
        return Rollout(prompts=prompts, completions=arms.reshape(-1, 1), logp_alpha=logp_alpha.reshape(-1, 1),
                       mask=torch.ones(arms.numel(), 1, dtype=torch.bool),
                       extra={"run": run, "context": prompts.repeat_interleave(group_size)})

    def score(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """log α of the arms ``rollout.completions[rows]`` from α's table (the sync audit's probe), ``[b, 1]``."""
        run, context = rollout.extra["run"][rows], rollout.extra["context"][rows]
        return torch.log_softmax(self.logits[run, context], dim=-1).gather(1, rollout.completions[rows])

    def synced_logprobs(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """log π_sync: α's table is the synced logits, computed as :meth:`TabularPolicy.logprobs` computes π_θ,
        so π_sync = α exactly (the off-policy split's mismatch is 0)."""
        return self.score(rollout, rows)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"logits": self.logits.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.logits.copy_(state["logits"])


class BanditTask:
    """Uniform contexts for each of R runs; Bernoulli(p[x, y]) rewards."""

    def __init__(self, problem: BanditProblem, runs: int) -> None:
        self.problem, self.runs = problem, runs

    def prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randint(self.problem.contexts, (self.runs * n,), generator=generator)

    def rewards(self, rollout: Rollout, generator: torch.Generator) -> torch.Tensor:
        return self.bernoulli(rollout.prompts, rollout.completions.reshape(len(rollout.prompts), -1), generator)

    def bernoulli(self, prompts: torch.Tensor, arms: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Rewards ``[R·P, G]`` ~ Bernoulli(p[x, y]) for contexts ``prompts [R·P]`` and ``arms [R·P, G]``."""
        return torch.bernoulli(self.problem.p[prompts[:, None], arms], generator=generator)


class BanditGroup(NamedTuple):
    """One prompt's group: G arms drawn from α, their log α and their 0/1 rewards, each ``[G]``."""

    arms: torch.Tensor
    logp_alpha: torch.Tensor
    rewards: torch.Tensor


def sample_bandit_group(problem: BanditProblem, logits: torch.Tensor, context: int, G: int,
                        generator: torch.Generator) -> BanditGroup:
    """Sample one group of G answers to ``context`` from α = softmax(``logits [C, K]``) and score them: what the
    loop's sampler and task do for one prompt (:class:`LaggedTabularSampler`, :class:`BanditTask`), without a loop.
    The entry point for using the primitives by hand (README, *Use the primitives*)."""
    require_int_at_least("G", G, 2)
    if tuple(logits.shape) != tuple(problem.p.shape):
        raise ValueError(f"logits must have the problem's shape [C, K] = {list(problem.p.shape)}, "
                         f"got {list(logits.shape)}")
    if isinstance(context, bool) or not isinstance(context, int) or not 0 <= context < problem.contexts:
        raise ValueError(f"context must be an integer in [0, {problem.contexts}), got {context!r}")
    sampler = LaggedTabularSampler(1, problem.contexts, problem.arms)
    sampler.logits[0] = logits.detach()
    prompt = torch.tensor([context])
    arms, logp_alpha = sampler.draw(prompt, G, generator)
    rewards = BanditTask(problem, 1).bernoulli(prompt, arms, generator)
    return BanditGroup(arms[0], logp_alpha[0], rewards[0])


# ----------------------------------------------------------------------------- running an experiment

BANDIT_DEFAULTS = dict(G=8, prompts_per_step=4, lr=0.5, optimizer="sgd", max_grad_norm=None, steps=300)


def bandit_config(**changes: object) -> GRPOConfig:
    """The notebook's default bandit config (SGD: plain gradient ascent on the logits)."""
    return GRPOConfig(**{**BANDIT_DEFAULTS, **changes})


@dataclass
class BanditRun:
    """Curves of R runs. Arrays are numpy, indexed ``[step, run]`` (or ``[step, run, C]``)."""

    config: GRPOConfig
    J: np.ndarray                 # [steps + 1, R] expected reward of π_θ, mean over contexts
    masked_frac: np.ndarray       # [steps] fraction of groups masked (all runs together)
    lag: np.ndarray               # [steps]
    optimizer_passes: np.ndarray  # [steps] cumulative optimiser passes
    grad_norm: np.ndarray         # [steps] gradient norm of the step's last pass, before clipping (0: skipped)
    records: list = field(default_factory=list)   # run_bandit's StepRecords; empty from the closed-form engine
    improvement: np.ndarray | None = None   # [steps, R, C] J(π_{k+1}) − J(π_k)
    bound: np.ndarray | None = None         # [steps, R, C] Theorem 1's right-hand side
    tv_pi_alpha: np.ndarray | None = None   # [steps, R, C]
    tv_pik_alpha: np.ndarray | None = None  # [steps, R, C]


def build_bandit_loop(problem: BanditProblem, config: GRPOConfig, runs: int = 8) -> GRPOLoop:
    """Policy, lagged sampler and task for R stacked runs, wired into the one loop."""
    require_int_at_least("runs", runs, 1)
    policy = TabularPolicy(runs, problem.contexts, problem.arms)
    sampler = LaggedTabularSampler(runs, problem.contexts, problem.arms)
    task = BanditTask(problem, runs)
    run_ids = torch.arange(runs).repeat_interleave(config.prompts_per_step * config.G)
    return GRPOLoop(policy, sampler, task, config, run_ids=run_ids)


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread: the bandit's tensors are tiny, and intra-op
    threads only add synchronisation (docs/benchmarks.md has a measurement)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def run_bandit(problem: BanditProblem, config: GRPOConfig, runs: int = 8, track_bound: bool = False) -> BanditRun:
    """Train R runs for ``config.steps`` steps; record exact J after every step.

    With ``track_bound`` also record, per step and context, the true improvement
    J(π_{k+1}) − J(π_k) and Theorem 1's lower bound with α the sampler's policy.
    """
    if track_bound:
        require_number_in("eps_std", config.eps_std, 0.0, MAX_EPS_STD)
    with single_thread():
        return _run_bandit(problem, config, runs, track_bound)


def _run_bandit(problem: BanditProblem, config: GRPOConfig, runs: int, track_bound: bool) -> BanditRun:
    loop = build_bandit_loop(problem, config, runs)
    p = problem.p
    J_curve = [J(loop.policy.probs(), p).mean(-1)]
    improvement, bound, tv_a, tv_k = [], [], [], []
    for _ in range(config.steps):
        pi_k = loop.policy.probs() if track_bound else None
        loop.step()
        pi_next = loop.policy.probs()
        J_curve.append(J(pi_next, p).mean(-1))
        if track_bound:
            alpha = loop.sampler.probs()
            improvement.append(true_improvement(pi_next, pi_k, p))
            bound.append(improvement_lower_bound(pi_next, pi_k, alpha, p, config.eps_std))
            tv_a.append(tv(pi_next, alpha))
            tv_k.append(tv(pi_k, alpha))
    records = loop.history

    def stack(xs: Sequence[torch.Tensor]) -> np.ndarray | None:
        return torch.stack(list(xs)).numpy() if xs else None

    return BanditRun(
        config=config, J=stack(J_curve),
        masked_frac=np.array([r.masked_frac for r in records]),
        lag=np.array([r.lag for r in records]),
        optimizer_passes=np.cumsum([0 if r.skipped else config.i for r in records]),
        grad_norm=np.array([r.grad_norm for r in records]), records=records, improvement=stack(improvement),
        bound=stack(bound), tv_pi_alpha=stack(tv_a), tv_pik_alpha=stack(tv_k))
