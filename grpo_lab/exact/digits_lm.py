"""Theorem 1 exactly on a real language model (docs/theory.md §4, notebook 01b).

The bandit's responses are few, so every quantity of Theorem 1 is exact. This module gives a real LM
(SmolLM2-135M) the same property by making its response set finite and small, so that with the whole table
π(· | x) in hand :mod:`grpo_lab.exact.bandit`'s exact functions (J, σ_α, L_α, TV, the bound) apply unchanged,
with "arms" = answers:

* **Vocabulary.** At every position the next token is restricted to V′ = (``"0"`` … ``"9"``, EOS) and the
  softmax is renormalised over V′ (constrained decoding: every other logit set to −∞)::

      π_θ(v | x, y_<t) = exp(z_v / T) / Σ_{u ∈ V′} exp(z_u / T),   v ∈ V′,   z the model's logits

* **Answers.** Y = the digit strings of length m < n followed by EOS, plus the digit strings of length n cut at
  the token limit (no EOS), so |Y| = Σ_{m<n} 10^m + 10^n. π(y | x) = Π_t π(y_t | x, y_<t) over y's tokens, and
  Σ_y π(y | x) = 1 exactly.
* **Reward.** r(x, y) = :func:`grpo_lab.lm.rewards.answer_reward` of y's text, the same reward the LLM route
  trains on (1 if y ends with EOS and is the right number, else 0).

====================== ================= ===========================================
symbol                 shape             meaning
====================== ================= ===========================================
V′ (``vocab_ids``)     ``[11]``          token ids of ``"0"``…``"9"`` then EOS
n (``max_tokens``)     int               tokens per answer at most (3 by default)
N                      int               |Y|, answers (1,111 for n = 3)
``tokens``/``mask``    ``[N, n]``        answers as indices into V′ / real tokens
``prefix``             ``[N, n]``        index of the prefix y_<t each token follows
cond                   ``[C, Π, 11]``    log π(v | x, prefix), Π = Σ_{m<n} 10^m prefixes
log π(y | x)           ``[C, N]``        :func:`sequence_logprobs`
r(x, y)                ``[C, N]``        reward table
====================== ================= ===========================================

Why this is a legitimate policy and why the probabilities sum to 1: docs/internals.md#digits-lm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..checks import require_int_at_least
from ..config import GRPOConfig
from ..lm.policy import LMPolicy, token_logprobs
from ..lm.rewards import answer_reward
from ..lm.sampling import HFSampler, build_rollout, tokenize_prompts
from ..lm.tasks import Problem
from ..lm.text_task import TextTask
from ..loop import GRPOLoop
from ..objective import tv_terms
from ..protocols import Rollout
from . import bandit

DIGITS = tuple("0123456789")


@dataclass(frozen=True)
class AnswerSpace:
    """Y, every answer of at most ``max_tokens`` tokens over V′ (module docstring)."""

    vocab_ids: torch.Tensor  # [11] token ids: digits, then EOS
    tokens: torch.Tensor     # [N, n] indices into V′; EOS index after the EOS
    mask: torch.Tensor       # [N, n] True up to and including the EOS
    prefix: torch.Tensor     # [N, n] prefix index of each position (level-major, lexicographic)
    texts: list[str]         # the decoded answers, as the sampler decodes them

    @property
    def max_tokens(self) -> int:
        return self.tokens.shape[1]


def answer_space(tokenizer: Any, max_tokens: int = 3) -> AnswerSpace:
    """Enumerate Y for ``tokenizer``: digit strings of length m < n + EOS, then length-n strings."""
    n = require_int_at_least("max_tokens", max_tokens, 1)
    digit_ids = [tokenizer.convert_tokens_to_ids(d) for d in DIGITS]
    if any(i is None or i == tokenizer.unk_token_id for i in digit_ids) or tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer needs one token per digit and an EOS token, got digits {digit_ids}")
    eos = len(DIGITS)
    rows, masks, prefixes = [], [], []
    for m in range(n + 1):
        for value in range(10**m):
            digits = [int(c) for c in str(value).zfill(m)] if m else []
            rows.append(digits + [eos] * (n - m))
            masks.append([True] * min(m + 1, n) + [False] * (n - m - 1))
            # the prefix of position t is digits[:t]: level t, rank int(digits[:t]) within it
            prefixes.append([(10**t - 1) // 9 + int("".join(map(str, digits[:t])) or 0) for t in range(n)])
    vocab_ids = torch.tensor(digit_ids + [tokenizer.eos_token_id])
    tokens = torch.tensor(rows)
    texts = tokenizer.batch_decode([vocab_ids[t[k]].tolist() for t, k in zip(tokens, torch.tensor(masks))],
                                   skip_special_tokens=True)
    return AnswerSpace(vocab_ids, tokens, torch.tensor(masks), torch.tensor(prefixes), texts)


@torch.no_grad()
def conditionals(model: torch.nn.Module, prompt_ids: torch.Tensor, space: AnswerSpace,
                 temperature: float = 1.0) -> torch.Tensor:
    """log π(v | x, prefix) for every prefix of length < n and v ∈ V′, ``[Π, 11]`` float64.

    One forward over the prompt ``[1, Lp]`` (unpadded), then one token per level
    with the key/value cache copied 10× per level: 1 + 10 + 100 new positions for
    n = 3 instead of 100 full sequences (same values: tested against the policy).
    """
    out = model(input_ids=prompt_ids, use_cache=True)
    levels, cache, Lp = [out.logits[:, -1]], out.cache, prompt_ids.shape[1]
    digits = space.vocab_ids[:len(DIGITS)].to(prompt_ids.device)
    for m in range(1, space.max_tokens):
        cache.batch_repeat_interleave(len(DIGITS))
        rows = 10**m
        out = model(input_ids=digits.repeat(rows // 10)[:, None], cache=cache, use_cache=True,
                    position_ids=torch.full((rows, 1), Lp + m - 1, device=prompt_ids.device))
        levels.append(out.logits[:, -1])
        cache = out.cache
    logits = torch.cat(levels)[:, space.vocab_ids.to(prompt_ids.device)].double() / temperature
    return logits.log_softmax(-1).cpu()


def token_table(cond: torch.Tensor, space: AnswerSpace) -> torch.Tensor:
    """log π(y_t | x, y_<t) of every answer's tokens, 0 after its end: ``[..., Π, 11]`` → ``[..., N, n]``."""
    return torch.where(space.mask, cond[..., space.prefix, space.tokens], 0.0)


def sequence_logprobs(cond: torch.Tensor, space: AnswerSpace) -> torch.Tensor:
    """log π(y | x) = Σ_t log π(y_t | x, y_<t) of every answer: ``[..., Π, 11]`` → ``[..., N]``."""
    return token_table(cond, space).sum(-1)


def answer_rewards(space: AnswerSpace, problem: Problem) -> torch.Tensor:
    """r(x, y) for every answer y of ``problem``'s prompt, ``[N]`` float64 (the LLM route's strict reward:
    an answer cut at the token limit has no EOS and scores 0)."""
    finished = ((space.tokens == len(DIGITS)) & space.mask).any(dim=1).tolist()
    return torch.tensor([answer_reward(t, problem.answer, problem.answer_format, finished=f)
                         for t, f in zip(space.texts, finished, strict=True)], dtype=torch.float64)


class RestrictedPolicy(LMPolicy):
    """π_θ with the softmax renormalised over V′ (module docstring); log-probs in float64."""

    def __init__(self, model: torch.nn.Module, space: AnswerSpace, temperature: float = 1.0) -> None:
        super().__init__(model, temperature)
        self.space = space

    def _score(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """log π(token) over V′ only, in float64: the model's scores at V′'s 11 tokens, / T, log-softmaxed there."""
        ids = self.space.vocab_ids.to(logits.device)
        hit = tokens[..., None] == ids
        if not hit.any(-1).all():
            raise ValueError("a completion holds a token outside V′ (digits and EOS): not from this policy")
        return token_logprobs(logits[..., ids].double() / self.temperature, hit.long().argmax(-1))


class RestrictedSampler(HFSampler):
    """α restricted to V′: draws whole answers from α's enumerated table (= ancestral sampling).

    α's tables are computed once per prompt between syncs. ``last_draw`` keeps the
    latest batch's answer indices ``[P, G]`` and prompts, for ratio statistics.
    """

    def __init__(self, policy: RestrictedPolicy, tokenizer: Any) -> None:
        super().__init__(policy, tokenizer, policy.space.max_tokens, eos_token_ids=[tokenizer.eos_token_id])
        self.space, self._tables = policy.space, {}
        self.last_draw: tuple[list[str], torch.Tensor] | None = None

    def table(self, prompt: str) -> torch.Tensor:
        """α's conditionals ``[Π, 11]`` for one formatted prompt."""
        if prompt not in self._tables:
            ids, _ = tokenize_prompts(self.tokenizer, [prompt])
            self._tables[prompt] = conditionals(self.model, ids.to(self.device), self.space, self.temperature)
        return self._tables[prompt]

    @torch.no_grad()
    def sample(self, prompts: Sequence[str], group_size: int, generator: torch.Generator) -> Rollout:
        G = require_int_at_least("group_size", group_size, 1)
        cond = torch.stack([self.table(p) for p in prompts])                           # [P, Π, 11]
        tok = token_table(cond, self.space)                                             # [P, N, n]
        index = torch.multinomial(tok.sum(-1).exp(), G, replacement=True, generator=generator)  # [P, G]
        logp_alpha = tok.gather(1, index[..., None].expand(-1, -1, tok.shape[-1])).flatten(0, 1)
        completions = self.space.vocab_ids[self.space.tokens[index.flatten()]]
        prompt_ids, prompt_mask = tokenize_prompts(self.tokenizer, prompts)
        self.last_draw = (list(prompts), index)
        return build_rollout(prompts, prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0),
                             completions, logp_alpha, self.tokenizer, self.eos_token_ids, self.pad_token_id)

    def sync(self, policy: LMPolicy) -> int:
        self._tables.clear()
        return super().sync(policy)


# ----------------------------------------------------------------------------- one step, exactly

@dataclass
class ExactStep:
    """Theorem 1's terms at step k, exact, one value per prompt (``[C]`` float64 arrays)."""

    k: int
    lag: int
    J_k: np.ndarray          # J(π_k)
    J_next: np.ndarray       # J(π_{k+1})
    mu_alpha: np.ndarray     # μ_α = J(α)
    sigma: np.ndarray        # σ = sqrt(μ_α(1 − μ_α) + ε_std)
    L: np.ndarray            # L_α(π_{k+1})
    tv_next: np.ndarray      # TV(π_{k+1}, α)
    tv_k: np.ndarray         # TV(π_k, α)
    bound: np.ndarray        # L − 2(1 − σ)/σ · TV(π_{k+1}, α) − 2 TV(π_k, α)
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)
    """:func:`ratio_stats` of π_k/α (``drift/…``) and π_{k+1}/α (``update/…``), on the step's
    samples (``…/batch``) and over all of Y weighted by α (``…/exact``)."""

    @property
    def improvement(self) -> np.ndarray:
        return self.J_next - self.J_k


def ratio_stats(logp: torch.Tensor, logp_alpha: torch.Tensor, mask: torch.Tensor,
                weight: torch.Tensor | None = None) -> dict[str, float]:
    """Sequence- vs token-level ratios r_t = π(y_t|·)/α(y_t|·) of answers ``[B, n]`` (log-probs, real tokens).

    ``seq`` = π(y)/α(y) = Π_t r_t, Theorem 1's ratio: E_α[seq] = 1 and ½ E_α|seq − 1| = TV(π, α).
    ``gspo`` = exp(mean_t log r_t), the kit's ``level="sequence"``; ``token`` = every r_t (``level="token"``).
    ``weight [B]``: the answers' weights; None = a batch's samples (uniform), α(y) = exact over Y.
    Returns E[seq] and, per level, ½ E|x − 1| (``*_half_abs_dev``) and max |log x| (``*_max_abs_log``).
    """
    w = torch.full(mask.shape[:1], 1.0 / len(mask), dtype=torch.float64) if weight is None else weight / weight.sum()
    log_r = torch.where(mask, logp - logp_alpha, 0.0)
    seq, gspo = log_r.sum(1), log_r.sum(1) / mask.sum(1)
    out = {"seq_mean": float((w * seq.exp()).sum()),
           "seq_half_abs_dev": float((w * tv_terms(logp, logp_alpha, mask)).sum()),  # = the loop's tv_estimate
           "gspo_half_abs_dev": float(0.5 * (w * torch.expm1(gspo).abs()).sum()),
           "seq_max_abs_log": float(seq.abs().max()), "gspo_max_abs_log": float(gspo.abs().max())}
    token_dev = torch.where(mask, (log_r.exp() - 1).abs(), 0.0).sum(1)
    out["token_half_abs_dev"] = float(0.5 * (w * token_dev).sum() / (w * mask.sum(1)).sum())
    out["token_max_abs_log"] = float(log_r.abs().max())
    return out


class ExactLM:
    """GRPOLoop on the restricted SmolLM2 (all problems every step) plus the exact tables of π_k, π_{k+1}, α."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, problems: Sequence[Problem], config: GRPOConfig,
                 max_tokens: int = 3) -> None:
        self.space = answer_space(tokenizer, max_tokens)
        self.problems, self.tokenizer = list(problems), tokenizer
        config = config.replace(prompts_per_step=len(self.problems), max_completion_length=max_tokens)
        model.requires_grad_(True)
        self.task = TextTask(self.problems, tokenizer)
        self.prompts = [self.task.prompt_of[id(p)] for p in self.problems]
        policy = RestrictedPolicy(model, self.space, config.temperature)
        self.loop = GRPOLoop(policy, RestrictedSampler(policy, tokenizer), self.task, config)
        self.rewards = torch.stack([answer_rewards(self.space, p) for p in self.problems])  # [C, N]
        self.cond = self.tables()                                                        # π_k's

    def tables(self) -> torch.Tensor:
        """π_θ's conditionals for every prompt, ``[C, Π, 11]``."""
        policy = self.loop.policy
        return torch.stack([conditionals(policy.model, tokenize_prompts(self.tokenizer, [p])[0].to(policy.device),
                                         self.space, policy.temperature) for p in self.prompts])

    def probs(self, cond: torch.Tensor) -> torch.Tensor:
        """π(y | x) of every answer, ``[C, N]``."""
        return sequence_logprobs(cond, self.space).exp()

    def step(self) -> ExactStep:
        """One step of the loop, then Theorem 1's terms from the exact tables."""
        cond_k = self.cond
        record = self.loop.step()
        self.cond = self.tables()
        sampler = self.loop.sampler
        cond_alpha = torch.stack([sampler.table(p) for p in self.prompts])
        pi_k, pi_next, alpha = self.probs(cond_k), self.probs(self.cond), self.probs(cond_alpha)
        p, eps = self.rewards, self.loop.config.eps_std
        numpy = {name: value.numpy() for name, value in dict(
            J_k=bandit.J(pi_k, p), J_next=bandit.J(pi_next, p), mu_alpha=bandit.J(alpha, p),
            sigma=bandit.sigma_alpha(alpha, p, eps), L=bandit.surrogate_L(pi_next, alpha, p, eps),
            tv_next=bandit.tv(pi_next, alpha), tv_k=bandit.tv(pi_k, alpha),
            bound=bandit.improvement_lower_bound(pi_next, pi_k, alpha, p, eps)).items()}
        prompts, index = sampler.last_draw
        rows = torch.tensor([self.prompts.index(x) for x in prompts])[:, None]
        tables = {name: token_table(c, self.space) for name, c in (("k", cond_k), ("next", self.cond),
                                                                   ("alpha", cond_alpha))}
        batch = {name: t[rows, index].flatten(0, 1) for name, t in tables.items()}
        every = {name: t.flatten(0, 1) for name, t in tables.items()}
        mask_batch, mask_every = self.space.mask[index.flatten()], self.space.mask.repeat(len(self.prompts), 1)
        ratios = {}
        for which, num in (("drift", "k"), ("update", "next")):
            ratios[f"{which}/batch"] = ratio_stats(batch[num], batch["alpha"], mask_batch)
            ratios[f"{which}/exact"] = ratio_stats(every[num], every["alpha"], mask_every, alpha.flatten())
        return ExactStep(k=record.step, lag=record.lag, ratios=ratios, **numpy)


BOUND_SERIES = (  # (row, name, ExactStep field, line dash, marker): each series its own style; colour: the prompt
    (1, "J(π_k+1) − J(π_k)", "improvement", "solid", "circle"), (1, "bound (Theorem 1)", "bound", "dot", "x"),
    (2, "TV(π_k, α)", "tv_k", "dash", "square"), (2, "TV(π_k+1, α)", "tv_next", "dashdot", "diamond"))


def bound_figure(runs: dict[str, list[ExactStep]], prompts: Sequence[str]) -> Any:
    """Per run (columns): J(π_{k+1}) − J(π_k) and Theorem 1's bound per prompt (top), TV(π_k, α) and
    TV(π_{k+1}, α) (bottom), against the step k (integer ticks). Colour: the prompt; line and marker: the series."""
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    titles = [f"{run}: {what}" for what in ("ΔJ and its bound", "distance to α") for run in runs]
    fig = make_subplots(rows=2, cols=len(runs), subplot_titles=titles, vertical_spacing=0.16, horizontal_spacing=0.15)
    for col, steps in enumerate(runs.values(), start=1):
        k = [s.k for s in steps]
        for c, prompt in enumerate(prompts):
            for row, name, field_name, dash, marker in BOUND_SERIES:
                fig.add_scatter(x=k, y=[getattr(s, field_name)[c] for s in steps], row=row, col=col,
                                mode="lines+markers", line=dict(color=qualitative.Plotly[c % 10], dash=dash),
                                marker=dict(symbol=marker, size=8), name=f"{prompt}: {name}",
                                legendgroup=f"{c}{name}", showlegend=col == 1)
        fig.update_yaxes(title_text="J(π_k+1) − J(π_k)", row=1, col=col)
        fig.update_yaxes(title_text="total variation", row=2, col=col)
    fig.update_xaxes(title_text="step k", tick0=0, dtick=1)
    fig.update_layout(height=760, title="Theorem 1 on SmolLM2-135M (digits + EOS, ≤ 3 tokens): exact",
                      legend=dict(orientation="h", y=-0.12))
    return fig
