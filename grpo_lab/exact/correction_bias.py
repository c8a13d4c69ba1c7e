"""Each correction's exact bias and variance under lag, on a finite answer tree (docs/theory.md §3,
*What each correction costs*; notebook 01b §4).

The answers Y of :mod:`grpo_lab.exact.digits_lm` form a tree: each prefix h (a node) has a softmax over the
V′ next tokens, π(v | h) = softmax(z_h)_v. This module works in the space of those **node logits** z
(``[Π, V]`` per prompt), not the network's weights: it is the gradient the model's last layer receives (up to
the Jacobian of the logits in θ), and it is the exact gradient of a tabular softmax policy. With 0/1 rewards
every expectation over a group drawn from α is a finite sum, so nothing below is sampled.

Per-sample update (the surrogate's first-pass gradient, π_θ = π_k, of one group member y ~ α)::

    ∂log π(y_t | h_t)/∂z_h = 1[h = h_t] · (onehot(y_t) − π_k(· | h_t))            (h_t: y's prefix before t)
    g_c(y) = λ(y) · Σ_t w_t(y) · ∂log π(y_t | h_t)/∂z                               u = A · g_c(y)
    w_t    = c · π_k/base, from is_correction_terms (the one rule; first pass: r = π_k/base, so r·A → c·r·A):
             token level    ratio: r′_t;  truncated: min(r′_t, C);  mask / icepop: r′_t or 0;  none: 1
             sequence level ratio: exp(mean_t log r′_t) (GSPO's);  others: c(Π_t r′_t), the same on every token
    λ(y)   = 1 (``loss_type="dr_grpo"``: every token weighs the same) or 1/L(y) (``"grpo"``: a mean per answer)

Advantage: with 0/1 rewards :func:`grpo_lab.advantages.whiten` gives member 1 an advantage A(r_1, K) that depends
only on its reward and the successes K among the G − 1 others, K ~ Binomial(G − 1, p_α), p_α = Σ_y α(y) r(y);
a group whose rewards all agree has A = 0 (it carries no gradient, under the zero-variance mask or without it;
``mask_normalize="batch"`` keeps it in the denominator, so it is a zero term). So, with ā(r) = E_K A(r, K) and
ā₂(r) = E_K A(r, K)²::

    m        = E[u]            = Σ_y α(y) ā(r_y) g_c(y)                 (the expected update of one group, / G)
    ∇J(π_k)                    = Σ_y π_k(y) r_y ∇log π_k(y)             (exact: λ = 1, w = 1)
    target   = κ_α ∇J(π_k),    κ_α = ā(1) − ā(0)                       (what exact importance sampling gives)
    cosine   = ⟨m, target⟩ / (‖m‖ ‖target‖)        rel_error = ‖m − target‖ / ‖target‖
    var      = Σ_y α ā₂(r_y) ‖g_c(y)‖² − ‖m‖²      (trace of the per-sample covariance)
    var_along= Σ_y α ā₂(r_y) ⟨g_c(y), d⟩² − ⟨m, d⟩²,   d = target/‖target‖
    group_var= (var + (G − 1)·(E[u_1·u_2] − ‖m‖²)) / G,   E[u_1·u_2] = Σ_{r,s} E_{K'} [A(r, s + K') A(s, r + K')]
               ⟨M_r, M_s⟩,  M_r = Σ_{y: r_y = r} α(y) g_c(y),  K' ~ Binomial(G − 2, p_α)   (the mean of G members)

Why κ_α: every correction sees the same advantages, whitened over groups drawn from α, so E_α[A · π_k/α · ∇log π]
= κ_α ∇J(π_k), whatever G: the exact (whole-answer) ratio is unbiased against κ_α∇J, and the corrections are
compared on the weight alone. ``whiten_scale`` = κ_α/κ_{π_k} (each summed over prompts) is how far that common
factor is from an on-policy group's. At lag 0 every weight is 1, so m = target exactly under ``dr_grpo`` (under
``grpo`` 1/L(y) tilts even the on-policy direction). Several prompts: their node logits are disjoint coordinates of
one vector, so m and target concatenate and var adds (one answer per prompt).

Shares: ``drop_share`` is the share of α's tokens (token level) or answers (sequence level) whose weight a mask
sets to 0; ``cap_share`` the share with ρ > C under the values that read C (as ``ratio_diagnostics``).

==================== ================ ===================================================================
symbol               shape            meaning
==================== ================ ===================================================================
``cond_k``           ``[C, Π, V]``    log π_k(v | h) per prompt and node (:func:`digits_lm.conditionals`)
``cond_alpha``       ``[C, Π, V]``    log α(v | h), the lagged sampler's
``rewards``          ``[C, N]``       r(x, y) ∈ {0, 1} (:func:`digits_lm.answer_rewards`)
``space``            AnswerSpace      Y: ``tokens``/``mask``/``prefix`` ``[N, n]``, EOS = index V − 1
A(r, K)              ``[2, G]``       :func:`advantage_table`, from ``whiten``
g_c(y)               ``[N, n, V]``    per token t: the block of g_c(y) at node h_t (:func:`answer_gradients`)
m, target            ``[C·Π·V]``      expected update, κ_α ∇J(π_k), flattened over prompts
==================== ================ ===================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..advantages import whiten
from ..checks import require_choice
from ..config import GRPOConfig
from ..objective import IS_MASKS, IS_WEIGHTS, LEVELS, is_correction_terms, sequence_log_ratio
from .digits_lm import AnswerSpace, token_table

CORRECTIONS = (("ratio", "token"), ("truncated", "token"), ("mask", "token"), ("icepop", "token"),
               ("none", "token"), ("ratio", "sequence"), ("truncated", "sequence"), ("mask", "sequence"),
               ("icepop", "sequence"))
"""(is_correction, level) pairs compared at the config's cap C and floor a; ``none`` reads no ratio, so its two
levels are one update. ``mask`` at C is the band [1/C, C]."""
TRL_DEFAULT: dict[str, Any] = dict(is_correction="icepop", level="sequence", is_cap=3.0, is_floor=None)
"""TRL 1.16's default correction (``vllm_importance_sampling_mode="sequence_mask"``, ``clip_max`` 3, no
``clip_min``): the answer's ρ = Π_t r′_t, its every token dropped where ρ > 3, no floor. TRL clips per token
(``importance_sampling_level="token"``), which at the first pass gives the same update. :func:`bias_sweep`
compares it as its own row (:data:`TRL_DEFAULT_NAME`), at its own band whatever the config's C and a."""
TRL_DEFAULT_NAME = "TRL default · seq"
LENGTH_WEIGHTS = ("dr_grpo", "grpo")


@dataclass(frozen=True)
class CorrectionBias:
    """One correction at one (π_k, α): the quantities of the module docstring, over all prompts."""

    is_correction: str
    level: str
    cosine: float
    rel_error: float
    var: float
    var_along: float
    group_var: float
    drop_share: float
    cap_share: float
    mean_norm: float
    target_norm: float
    whiten_scale: float
    label: str | None = None

    @property
    def name(self) -> str:
        """``label``, or the correction with `` · seq`` at level sequence."""
        if self.label is not None:
            return self.label
        return self.is_correction if self.level == "token" else f"{self.is_correction} · seq"


def advantage_table(G: int, eps_std: float = 1e-4, unbiased: bool = False,
                    eps_placement: str = "under_sqrt") -> torch.Tensor:
    """A(r, K) ``[2, G]``: :func:`whiten`'s advantage of a member with reward r when K of the G − 1 others
    succeed (0/1 rewards), float64."""
    rows = [[float(r)] + [1.0] * K + [0.0] * (G - 1 - K) for r in (0, 1) for K in range(G)]
    A = whiten(torch.tensor(rows, dtype=torch.float64), eps_std, unbiased, eps_placement)[:, 0]
    return A.reshape(2, G)


def binomial_pmf(n: int, p: float) -> torch.Tensor:
    """P(K = k), k = 0…n, K ~ Binomial(n, p), float64."""
    return torch.tensor([math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)], dtype=torch.float64)


def first_pass_weights(logp_k: torch.Tensor, logp_alpha: torch.Tensor, mask: torch.Tensor, is_correction: str,
                       level: str = "token", is_cap: float = 2.0, is_floor: float | None = 0.5
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, ρ): the weight each token's A·∇log π gets at the first pass, c · π_k/base of
    :func:`is_correction_terms` (formed as :func:`grpo_objective` forms it at either level), 0 off ``mask``;
    and the ρ that c reads (the token's r′ or its answer's Π_t r′_t). All ``[N, n]``."""
    require_choice("level", level, LEVELS)
    if level == "sequence":
        lengths = mask.sum(dim=1, keepdim=True).clamp(min=1)

        def seq_mean(x: torch.Tensor) -> torch.Tensor:
            return (torch.where(mask, x, 0.0).sum(dim=1, keepdim=True) / lengths).expand_as(x)

        ratio_k, ratio_alpha = seq_mean(logp_k), seq_mean(logp_alpha)
        log_rho = sequence_log_ratio(logp_k, logp_alpha, mask).expand_as(logp_k)
    else:
        ratio_k, ratio_alpha, log_rho = logp_k, logp_alpha, torch.where(mask, logp_k - logp_alpha, 0.0)
    base, c = is_correction_terms(ratio_k, ratio_alpha, is_correction, is_cap, is_floor,
                                  log_rho if level == "sequence" else None)
    w = torch.exp(ratio_k - base) * (1.0 if c is None else c)
    return torch.where(mask, w, 0.0), log_rho.exp()


def answer_gradients(cond_k: torch.Tensor, space: AnswerSpace, weights: torch.Tensor,
                     loss_type: str = "dr_grpo") -> torch.Tensor:
    """g_c(y) in node-logit space, as blocks ``[N, n, V]``: token t's block λ(y)·w_t·(onehot(y_t) − π_k(·|h_t))
    sits at node ``space.prefix[y, t]`` (distinct nodes along one answer)."""
    require_choice("loss_type", loss_type, LENGTH_WEIGHTS)
    probs = cond_k.exp()[space.prefix]                                               # π_k(· | h_t) [N, n, V]
    onehot = torch.nn.functional.one_hot(space.tokens, cond_k.shape[-1]).to(probs.dtype)
    lengths = space.mask.sum(1, keepdim=True).to(probs.dtype)
    lam = 1.0 / lengths if loss_type == "grpo" else torch.ones_like(lengths)
    return (lam * weights)[..., None] * (onehot - probs)


def to_nodes(coef: torch.Tensor, blocks: torch.Tensor, space: AnswerSpace, nodes: int) -> torch.Tensor:
    """Σ_y coef(y) g(y) as a flat node-logit vector ``[Π·V]`` (blocks from :func:`answer_gradients`)."""
    out = torch.zeros(nodes, blocks.shape[-1], dtype=blocks.dtype)
    out.index_put_((space.prefix,), coef[:, None, None] * blocks, accumulate=True)
    return out.flatten()


def bias_of(cond_k: torch.Tensor, cond_alpha: torch.Tensor, rewards: torch.Tensor, space: AnswerSpace,
            is_correction: str, level: str = "token", *, G: int = 8, is_cap: float = 2.0,
            is_floor: float | None = 0.5, eps_std: float = 1e-4, unbiased_std: bool = False,
            eps_placement: str = "under_sqrt", loss_type: str = "dr_grpo", label: str | None = None
            ) -> CorrectionBias:
    """The module docstring's quantities for one (is_correction, level) at (π_k, α), summed over Y exactly;
    ``label`` names it (:attr:`CorrectionBias.name`)."""
    if bool(((rewards != 0) & (rewards != 1)).any()):
        raise ValueError("the exact group sums need 0/1 rewards")
    A = advantage_table(G, eps_std, unbiased_std, eps_placement)
    nodes, dims = cond_k.shape[-2], cond_k.shape[-2] * cond_k.shape[-1]
    m, target, rows = [], [], []
    sums = dict(var=0.0, second_along=0.0, cross=0.0, drop=0.0, cap=0.0, count=0.0)
    for ck, ca, r in zip(cond_k, cond_alpha, rewards):
        logp_k, logp_a = token_table(ck, space), token_table(ca, space)
        alpha, pi_k, ri = logp_a.sum(-1).exp(), logp_k.sum(-1).exp(), r.long()
        p_alpha, p_k = float(alpha @ r), float(pi_k @ r)
        a_bar, a_sq = A @ binomial_pmf(G - 1, p_alpha), A**2 @ binomial_pmf(G - 1, p_alpha)
        a_bar_k = A @ binomial_pmf(G - 1, p_k)
        w, rho = first_pass_weights(logp_k, logp_a, space.mask, is_correction, level, is_cap, is_floor)
        blocks = answer_gradients(ck, space, w, loss_type)
        m.append(to_nodes(alpha * a_bar[ri], blocks, space, nodes))
        grad_J = to_nodes(pi_k * r, answer_gradients(ck, space, space.mask.to(ck.dtype)), space, nodes)
        target.append(float(a_bar[1] - a_bar[0]) * grad_J)
        rows.append((alpha, a_sq[ri], blocks, ri, A, p_alpha, float(a_bar[1] - a_bar[0]),
                     float(a_bar_k[1] - a_bar_k[0])))
        unit = space.mask.double() if level == "token" else torch.ones(len(alpha), 1, dtype=torch.float64)
        on = space.mask if level == "token" else torch.ones_like(unit, dtype=torch.bool)
        sums["count"] += float(alpha @ unit.sum(1))
        if is_correction in IS_MASKS:
            sums["drop"] += float(alpha @ (on & (w[:, :1 if level == "sequence" else None] == 0)).double().sum(1))
        if is_correction in IS_WEIGHTS:
            rho_u = rho[:, :1] if level == "sequence" else rho
            sums["cap"] += float(alpha @ (on & (rho_u > is_cap)).double().sum(1))
    m_all, target_all = torch.cat(m), torch.cat(target)
    t_norm = float(target_all.norm())
    d = target_all / t_norm if t_norm > 0 else target_all
    var = var_along = group_var = 0.0
    for (alpha, a_sq, blocks, ri, A, p_alpha, _, _), mp, dp in zip(rows, m, d.split(dims)):
        sq = (blocks**2).sum((1, 2))                                                   # ‖g_c(y)‖²: distinct nodes
        along = (blocks * dp.reshape(nodes, -1)[space.prefix]).sum((1, 2))            # ⟨g_c(y), d⟩
        v_p = float(alpha @ (a_sq * sq)) - float(mp @ mp)
        var += v_p
        var_along += float(alpha @ (a_sq * along**2)) - float(mp @ dp) ** 2
        M = torch.stack([to_nodes(alpha * (ri == s), blocks, space, nodes) for s in (0, 1)])    # M_r  [2, Π·V]
        pair = binomial_pmf(G - 2, p_alpha)
        cross = sum(float(pair @ (A[r, s:s + G - 1] * A[s, r:r + G - 1])) * float(M[r] @ M[s])
                    for r in (0, 1) for s in (0, 1))
        group_var += (v_p + (G - 1) * (cross - float(mp @ mp))) / G
    m_norm = float(m_all.norm())
    cosine = float(m_all @ target_all) / (m_norm * t_norm) if m_norm > 0 and t_norm > 0 else math.nan
    kappa_alpha, kappa_k = sum(row[6] for row in rows), sum(row[7] for row in rows)
    return CorrectionBias(is_correction, level, cosine=cosine,
                          rel_error=float((m_all - target_all).norm()) / t_norm if t_norm > 0 else math.nan,
                          var=var, var_along=var_along, group_var=group_var,
                          drop_share=sums["drop"] / sums["count"], cap_share=sums["cap"] / sums["count"],
                          mean_norm=m_norm, target_norm=t_norm,
                          whiten_scale=kappa_alpha / kappa_k if kappa_k else math.nan, label=label)


def bias_sweep(tables: list[torch.Tensor], cond_alpha: torch.Tensor, rewards: torch.Tensor, space: AnswerSpace,
               config: GRPOConfig, corrections: tuple[tuple[str, str], ...] = CORRECTIONS,
               loss_type: str = "dr_grpo", **overrides: Any) -> dict[int, list[CorrectionBias]]:
    """``tables[ℓ]`` = π_ℓ's conditionals after ℓ steps from α (lag ℓ): {ℓ: one :class:`CorrectionBias` per
    correction, then :data:`TRL_DEFAULT` at its own band}, with ``config``'s G, whitening, cap and floor
    (``overrides`` replace ``is_cap``/``is_floor``)."""
    if config.mask_normalize != "batch":
        raise ValueError("mask_normalize='unmasked' divides by a random count of groups: not one group's mean")
    knobs = dict(G=config.G, is_cap=config.is_cap, is_floor=config.is_floor, eps_std=config.eps_std,
                 unbiased_std=config.unbiased_std, eps_placement=config.eps_placement, loss_type=loss_type)
    knobs.update(overrides)
    trl = {**knobs, "is_cap": TRL_DEFAULT["is_cap"], "is_floor": TRL_DEFAULT["is_floor"], "label": TRL_DEFAULT_NAME}
    return {lag: [bias_of(cond_k, cond_alpha, rewards, space, c, level, **knobs) for c, level in corrections]
            + [bias_of(cond_k, cond_alpha, rewards, space, TRL_DEFAULT["is_correction"], TRL_DEFAULT["level"], **trl)]
            for lag, cond_k in enumerate(tables)}


STYLES = {"ratio": ("#1f77b4", "circle"), "truncated": ("#ff7f0e", "square"), "mask": ("#2ca02c", "diamond"),
          "icepop": ("#9467bd", "triangle-up"), "none": ("#7f7f7f", "x"), TRL_DEFAULT_NAME: ("#d62728", "star")}
"""Colour and marker per correction (a labelled row by its name); the level is the line's dash and the marker's
fill (token: solid line, filled marker; sequence: dashed line, open marker)."""
MARKER_PX = {"mask": 15}
"""Marker size where not 9 px: ``mask`` at C is the band [1/C, C], which is ``icepop``'s wherever the floor a is
1/C, so its points lie under icepop's (drawn later) and its larger marker shows around them."""


def bias_figure(sweep: dict[int, list[CorrectionBias]], lag: int | None = None) -> Any:
    """Bias against per-sample variance, one curve over the lag per correction: relative error (left, every lag)
    and 1 − cosine (right, log scale, lags ≥ 1: at lag 0 it is 0); x = var/‖target‖². ``lag`` rings that lag.
    A point's lag shows on hover (its ``text``): printed beside every point, the labels of ten curves run into
    each other."""
    from plotly.subplots import make_subplots

    lags = sorted(sweep)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.2, subplot_titles=(
        "relative error ‖m − κ∇J‖/‖κ∇J‖", "1 − cosine(m, ∇J), lags ≥ 1"))
    for j, first in enumerate(sweep[lags[0]]):
        color, symbol = STYLES.get(first.name, STYLES[first.is_correction])
        symbol += "" if first.level == "token" else "-open"
        points = [sweep[k][j] for k in lags]
        for col, ys, ks in ((1, [p.rel_error for p in points], lags),
                            (2, [1 - p.cosine for p in points[1:]], lags[1:])):
            xs = [p.var / p.target_norm**2 for p in (points if col == 1 else points[1:])]
            fig.add_scatter(x=xs, y=[max(y, 1e-16) for y in ys] if col == 2 else ys, row=1, col=col,
                            mode="lines+markers", text=[str(k) for k in ks],
                            line=dict(color=color, dash="solid" if first.level == "token" else "dash"),
                            marker=dict(symbol=symbol, size=MARKER_PX.get(first.is_correction, 9),
                                        line=dict(color=color, width=1.5)),
                            name=first.name, legendgroup=first.name,
                            showlegend=col == 1, hovertemplate="lag %{text}<br>var %{x:.3g}<br>%{y:.3g}")
    for col in (1, 2):
        chosen = [] if lag is None or (col == 2 and lag == lags[0]) else sweep[lag]
        fig.add_scatter(x=[p.var / p.target_norm**2 for p in chosen],
                        y=[p.rel_error if col == 1 else max(1 - p.cosine, 1e-16) for p in chosen], row=1, col=col,
                        mode="markers", marker=dict(symbol="circle-open", size=18, color="black"),
                        name=f"lag {lag}", legendgroup="chosen", showlegend=col == 1)
    fig.update_xaxes(type="log", title_text="per-sample variance tr Cov(u) / ‖κ∇J‖²")
    fig.update_yaxes(title_text="relative error", row=1, col=1)
    fig.update_yaxes(title_text="1 − cosine", type="log", row=1, col=2)
    fig.update_layout(height=520, title="Each correction's bias and variance under lag, exact<br><sup>each curve "
                                        "runs over the lags 0, 1, 2, …; hover a point for its lag</sup>")
    return fig
