"""Exercises of notebook 01: write a piece of GRPO, check it against the library.

===================== ============================================== =========================
exercise              signature                                      checked against
===================== ============================================== =========================
``whiten``            ``f(rewards [P, G], eps_std) -> A [P, G]``     :func:`grpo_lab.whiten`
``f_eps``             ``f(r, r_prime, A, eps) -> f_ε`` (elementwise) :func:`grpo_lab.clipped_surrogate`
``bound``             ``f(pi, pi_k, alpha, p, eps_std) -> [C]``      ``bandit.improvement_lower_bound``
``r_prime``           ``f(logp_k, logp_alpha, mask) -> r′ [B, T]``   :func:`grpo_lab.lm.group_view.token_ratios`
``tv``                ``f(logp_k, logp_alpha, mask) -> TV`` (scalar) mean of :func:`grpo_lab.objective.tv_terms`
``sync_schedule``     ``f(steps, v) -> lag [steps]``                 ``schedules.make_sync_schedule``
``correction_weight`` ``f(logp_k, logp_alpha, mask, is_correction,   ``correction_bias.first_pass_weights``
                      is_cap, is_floor) -> w [B, T]``
===================== ============================================== =========================

The first three are notebook 01's (bandit), the next three notebook 02's (logged log-probs of
a language model's completions), the last notebook 01b's. :func:`check_prediction` scores notebook 02's
"predict, then run" answers against values observed in the run, :func:`check_choice` notebook 01b's
answers that name a correction, :func:`answer_tries` notebook 01's "try it yourself" guesses.

A stub that raises ``NotImplementedError`` is not a failure: the check then
verifies the reference solution instead (so the notebook runs unattended) and
prints a hint; ``show_solution(name)`` prints it. A wrong function raises :class:`ExerciseMismatch`
(an ``AssertionError``), which a notebook shows as one line: the first case where it differs from the
library, what was expected, what came, and a hint, not a traceback into this module.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence

import torch

from ..advantages import whiten
from ..checks import require_choice, require_number_in
from ..exact.bandit import BanditRun, improvement_lower_bound
from ..exact.bandit_lab import TRY_IT, TryIt, final_j
from ..lm.group_view import token_ratios
from ..objective import clipped_surrogate, ratios_as_log_probs, tv_terms
from ..schedules import make_sync_schedule


class ExerciseMismatch(AssertionError):
    """A learner's function differs from the library. IPython shows ``_render_traceback_``'s lines in place of
    the traceback, so the learner reads one line (expected, got, hint), not this module's internals."""

    def _render_traceback_(self) -> list[str]:
        return [f"✗ {self}"]


def solution_whiten(rewards: torch.Tensor, eps_std: float) -> torch.Tensor:
    mu = rewards.mean(dim=1, keepdim=True)                          # μ per group
    var = ((rewards - mu) ** 2).mean(dim=1, keepdim=True)           # plug-in variance of the G samples (/G)
    return (rewards - mu) / (var + eps_std).sqrt()                  # ε_std under the square root


def solution_f_eps(r: torch.Tensor, r_prime: torch.Tensor, A: torch.Tensor, eps: float) -> torch.Tensor:
    clipped = torch.clamp(r, min=(r_prime - eps).clamp(min=0.0), max=r_prime + eps)   # band around r′
    return torch.minimum(r * A, clipped * A)                                          # pessimistic of the two


def solution_bound(pi: torch.Tensor, pi_k: torch.Tensor, alpha: torch.Tensor, p: torch.Tensor,
                   eps_std: float) -> torch.Tensor:
    mu = (alpha * p).sum(-1)                                        # μ_α(x)
    sigma = (mu * (1 - mu) + eps_std).sqrt()                        # σ_{α,r,ε}(x) for 0/1 rewards
    L = ((pi * p).sum(-1) - mu) / sigma                             # L_α(π) = (J(π) − μ_α)/σ

    def tv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return 0.5 * (a - b).abs().sum(-1)

    return L - 2 * (1 - sigma) / sigma * tv(pi, alpha) - 2 * tv(pi_k, alpha)


def solution_r_prime(logp_k: torch.Tensor, logp_alpha: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    ratio = torch.exp(logp_k - logp_alpha)                          # π_k/α per token
    return ratio * mask                                             # 0 on padding


def solution_tv(logp_k: torch.Tensor, logp_alpha: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    seq_ratio = torch.exp(((logp_k - logp_alpha) * mask).sum(dim=1))    # π_k(y)/α(y): product over tokens
    return 0.5 * (seq_ratio - 1).abs().mean()                           # ½ E_{y~α} |π_k/α − 1|


def solution_sync_schedule(steps: int, v: int) -> torch.Tensor:
    last, lags = 0, []
    for k in range(steps):
        if k % v == 0:                                              # sync: α ← π_k
            last = k
        lags.append(k - last)
    return torch.tensor(lags)


def solution_correction_weight(logp_k: torch.Tensor, logp_alpha: torch.Tensor, mask: torch.Tensor,
                               is_correction: str, is_cap: float, is_floor: float | None) -> torch.Tensor:
    rho = torch.exp(logp_k - logp_alpha)                            # ρ = r′ = π_k/α per token
    if is_correction == "ratio":
        w = rho                                                     # the full ratio
    elif is_correction == "none":
        w = torch.ones_like(rho)                                    # α ignored
    elif is_correction == "truncated":
        w = rho.clamp(max=is_cap)                                   # capped at C
    else:                                                           # mask: band [1/C, C]; icepop: [a, C]
        floor = 1 / is_cap if is_correction == "mask" else (is_floor or 0.0)
        w = torch.where((rho >= floor) & (rho <= is_cap), rho, torch.zeros_like(rho))
    return w * mask                                                 # 0 on padding


SOLUTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "whiten": solution_whiten, "f_eps": solution_f_eps, "bound": solution_bound,
    "r_prime": solution_r_prime, "tv": solution_tv, "sync_schedule": solution_sync_schedule,
    "correction_weight": solution_correction_weight}
HINTS = {
    "whiten": "per row: subtract the mean, divide by sqrt(variance of the row, dividing by G, + eps_std)",
    "f_eps": "clip r into [max(r′ − ε, 0), r′ + ε], then take the smaller of r·A and clipped·A",
    "bound": "L_α(π) = (J(π) − μ_α)/σ with σ = sqrt(μ_α(1 − μ_α) + ε_std); TV = ½ Σ |difference|",
    "r_prime": "r′ = exp(log π_k − log α) per token; set padding (mask False) to 0",
    "tv": "a completion's ratio is exp of the summed token log-ratios (padding excluded); TV ≈ ½ mean |ratio − 1|",
    "sync_schedule": "α is synced at every k with k % v == 0; the lag is k minus the last sync step",
    "correction_weight": "ρ = exp(log π_k − log α); ratio: ρ; none: 1; truncated: min(ρ, C); mask: ρ inside "
                         "[1/C, C], else 0; icepop: ρ inside [a, C] (a = None: no floor), else 0; 0 on padding",
}


def library_f_eps(r: torch.Tensor, r_prime: torch.Tensor, A: torch.Tensor, eps: float) -> torch.Tensor:
    """f_ε from the library, which takes the log-probabilities of the ratios (:func:`ratios_as_log_probs`)."""
    return clipped_surrogate(*ratios_as_log_probs(r, r_prime), A, eps)


def whiten_cases() -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    binary = torch.bernoulli(torch.full((6, 8), 0.3, dtype=torch.float64), generator=g)
    binary[0], binary[1] = 0.0, 1.0                                 # an all-wrong and an all-right group
    graded = torch.rand(5, 4, generator=g, dtype=torch.float64)     # partial credit in [0, 1]
    return [(binary, 1e-4), (binary, 0.1), (graded, 1e-4), (graded[:, :2], 0.5)]


def f_eps_cases() -> list[tuple]:
    g = torch.Generator().manual_seed(2)
    r = torch.linspace(0.01, 4.0, 400, dtype=torch.float64)
    cases = []
    for eps in (0.1, 0.2, 0.3):
        r_prime = torch.rand(400, generator=g, dtype=torch.float64) * 3 + 0.05     # r′ ≠ 1: off-policy
        for a in (1.0, -1.0, 0.7):
            cases.append((r, r_prime, torch.full_like(r, a), eps))
        cases.append((r, torch.ones_like(r), torch.randn(400, generator=g, dtype=torch.float64), eps))
    return cases


def bound_cases() -> list[tuple]:
    g = torch.Generator().manual_seed(3)

    def simplex(*shape: int) -> torch.Tensor:
        return torch.softmax(2 * torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1)

    p = torch.rand(6, 5, generator=g, dtype=torch.float64)
    return [(simplex(6, 5), simplex(6, 5), simplex(6, 5), p, eps) for eps in (1e-4, 0.05, 0.75)]


def logprob_cases() -> list[tuple]:
    """Log-probs of 8 completions × 6 tokens from α and from π_k (lagged), ragged padding."""
    g = torch.Generator().manual_seed(4)
    cases = []
    for drift in (0.0, 0.05, 0.5):
        logp_alpha = -torch.rand(8, 6, generator=g, dtype=torch.float64) * 3
        logp_k = logp_alpha + drift * torch.randn(8, 6, generator=g, dtype=torch.float64)
        lengths = torch.randint(1, 7, (8,), generator=g)
        mask = torch.arange(6)[None, :] < lengths[:, None]
        cases.append((logp_k, logp_alpha, mask))
    return cases


def loop_lags(steps: int, v: int) -> torch.Tensor:
    """The lags the loop's fixed sync schedule gives, step by step."""
    schedule, lags = make_sync_schedule("fixed", v, threshold=0.0), []
    for k in range(steps):
        if schedule.begin(k):
            schedule.mark_synced(k)
        lags.append(schedule.lag(k))
    return torch.tensor(lags)


def library_correction_weight(logp_k: torch.Tensor, logp_alpha: torch.Tensor, mask: torch.Tensor,
                              is_correction: str, is_cap: float, is_floor: float | None) -> torch.Tensor:
    """The weight on each token's A·∇log π at the first pass, from the library's one rule (token level); imported
    here, as it loads the digits LM's module."""
    from ..exact.correction_bias import first_pass_weights

    return first_pass_weights(logp_k, logp_alpha, mask.bool(), is_correction, "token", is_cap, is_floor)[0]


def correction_weight_cases() -> list[tuple]:
    return [(logp_k, logp_alpha, mask, name, cap, floor) for logp_k, logp_alpha, mask in logprob_cases()
            for name in ("ratio", "truncated", "mask", "icepop", "none") for cap, floor in ((2.0, 0.5), (1.3, None))]


REFERENCES = {"whiten": (whiten, whiten_cases), "f_eps": (library_f_eps, f_eps_cases),
              "bound": (improvement_lower_bound, bound_cases),
              "r_prime": (token_ratios, logprob_cases), "tv": (lambda *args: tv_terms(*args).mean(), logprob_cases),
              "sync_schedule": (loop_lags, lambda: [(20, 1), (20, 4), (23, 8), (5, 10)]),
              "correction_weight": (library_correction_weight, correction_weight_cases)}


def check(name: str, candidate: Callable[..., torch.Tensor]) -> str:
    """Compare ``candidate`` with the library on every case of exercise ``name``.

    Returns ``"yours"`` if the candidate passed, ``"reference"`` if it raised
    ``NotImplementedError`` and the reference solution was checked instead.
    """
    require_choice("name", name, SOLUTIONS)
    reference, cases = REFERENCES[name]
    checked = "yours"
    try:
        candidate(*cases()[0])
    except NotImplementedError:
        print(f"{name}: not implemented yet, so the reference solution is checked instead.\n"
              f"  hint: {HINTS[name]}\n  reveal it with show_solution({name!r})")
        candidate, checked = SOLUTIONS[name], "reference"
    for n, args in enumerate(cases()):
        expected = reference(*args)
        got = candidate(*args)
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            raise ExerciseMismatch(f"{name}, case {n}: expected a tensor of shape {tuple(expected.shape)}, got "
                                   f"{getattr(got, 'shape', type(got).__name__)}; hint: {HINTS[name]}")
        if not torch.allclose(got.to(expected.dtype), expected, rtol=1e-6, atol=1e-9):
            worst = int((got - expected).abs().argmax())
            raise ExerciseMismatch(f"{name}, case {n}: differs from the library at flat index {worst}: expected "
                                   f"{expected.flatten()[worst].item():.6g}, got {got.flatten()[worst].item():.6g}; "
                                   f"hint: {HINTS[name]}")
    if checked == "yours":
        print(f"{name}: your function matches the library on {len(cases())} cases ✓")
    else:  # no ✓: nothing of yours was checked
        print(f"{name}: still a stub; the reference solution matches the library on {len(cases())} cases "
              "(write your function and run the check again)")
    return checked


def show_solution(name: str) -> None:
    """Print the reference solution of exercise ``name``."""
    require_choice("name", name, SOLUTIONS)
    print(inspect.getsource(SOLUTIONS[name]))


def check_prediction(question: str, guess: float | None, observed: float, rel_tol: float = 0.25,
                     show: bool = True) -> str:
    """Score a prediction against what the run observed: ``"✓"`` within ``rel_tol`` of it (relative),
    ``"✗"`` otherwise, ``"no prediction"`` for ``None``. With ``show``, print the verdict, and the
    observed value only once a prediction is given, so that writing one comes first."""
    require_number_in("rel_tol", rel_tol, 0.0, low_open=True)
    if guess is None:
        verdict = "no prediction"
        message = f"{question}: no prediction yet (write one in `predictions`, then run the cell again)"
    else:
        verdict = "✓" if abs(guess - observed) <= rel_tol * abs(observed) else "✗"
        message = f"{question}: you said {guess:g}, the run gave {observed:.3g} {verdict}"
    if show:
        print(message)
    return verdict


def check_choice(question: str, guess: str | None, observed: str | set[str], options: tuple[str, ...],
                 show: bool = True) -> str:
    """Score an answer that names one of ``options`` against what the run gave (``observed``: one option, or the
    set of options that are all right): ``"✓"``, ``"✗"``, or ``"no prediction"`` for ``None``. With ``show``,
    print the verdict, and what the run gave only once a guess is given, as :func:`check_prediction` does."""
    right = {observed} if isinstance(observed, str) else set(observed)
    if not right <= set(options) or (guess is not None and guess not in options):
        raise ValueError(f"{question}: answers are one of {list(options)}, got {guess!r} against {sorted(right)}")
    if guess is None:
        verdict, message = "no prediction", f"{question}: no prediction yet (write one, then run the cell again)"
    else:
        verdict = "✓" if guess in right else "✗"
        message = f"{question}: you said {guess!r}, the run gave {' / '.join(sorted(right))} {verdict}"
    if show:
        print(message)
    return verdict


def answer_tries(predictions: Mapping[str, float], tried: dict[str, BanditRun],
                 questions: Sequence[TryIt] = TRY_IT) -> int:
    """Notebook 01 §6: score each guess in ``predictions`` (a try's final J, by its name in ``tried``) against
    the run (:func:`check_prediction`, 2 %), and print a question's answer once its first try has been guessed,
    so that no answer comes before the guess. Returns the number of answers printed."""
    unknown = sorted(set(predictions) - set(tried))
    if unknown:
        raise ValueError(f"no try is named {unknown}; the tries are: {' · '.join(tried)}")
    for name, guess in predictions.items():
        check_prediction(f"{name}: final J", guess, final_j(tried, name), rel_tol=0.02)
    answered = [q for q in questions if predictions.get(q.tries[0]) is not None]
    for q in answered:
        print(f"{q.question}: {q.answer(tried)}")
    if not answered:
        print(f"{len(tried)} tries trained. Write your guess of a final J in `predictions`, keyed by the try a "
              "question asks about, and run this cell again: its answer follows.")
        for q in questions:
            print(f"  {q.question}: predictions[{q.tries[0]!r}]")
    return len(answered)
