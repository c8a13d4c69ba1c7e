"""Verifiable rewards r(x, y) in [0, 1] (docs/theory.md §1), safe in threads and processes.

Definitions (precise, because the reward is the experiment):

* **extracted answer** of a completion: the contents of its last well-formed
  ``\\boxed{...}``; if it has none, its last number (``-?`` digits, thousands
  groups ``1,234`` allowed, optional decimals); if neither, no answer.
* **plain number**: after removing spaces and ``$``, a decimal or a ratio of two (``1/2``).
* **answers match** when both are plain numbers with the same exact value
  (``Fraction`` arithmetic, no rounding), or they are the same string, or otherwise
  ``math_verify.verify`` says so, given at most ``timeout`` seconds; a timeout or an
  answer over MAX_VERIFY_CHARS is a mismatch.
* **finished**: the completion ended with a stop (EOS) token within its token
  budget; one cut at the budget is **truncated** (:func:`finished_completions`).
* **strict answer**, in the form the prompt asks for
  (:data:`grpo_lab.lm.tasks.ANSWER_INSTRUCTIONS`): ``number``: the whole
  completion, stripped of surrounding whitespace and of one trailing period,
  is one number (``-?`` digits, thousands groups, optional decimals, optional
  ``/`` and a second such number); ``boxed``: the contents of the last
  ``\\boxed{...}``, with no fallback to the last number.
* **strict reward** (:func:`strict_reward`) = 1 if the completion finished and
  its strict answer matches the gold, else 0. **lenient reward**
  (:func:`lenient_reward`) = 1 if its extracted answer matches, finished or
  not: it also credits run-ons, operand echoes and wrong equations whose last
  number happens to be the gold.
* **format reward** = 1 if the completion has a strict answer (the requested form).
  :func:`answer_reward` = 1 if correct under ``scoring`` (``"strict"`` or
  ``"lenient"``), else ``format_weight`` × format (under strict, only if finished).

Where math-verify is needed, :func:`answers_match` asks the process's worker (:mod:`grpo_lab.lm.verifier_pool`:
why a worker process, its timeouts and its counts). Worked examples of each definition:
docs/internals.md#rewards.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from fractions import Fraction
from typing import Any

import torch

from ..checks import require_choice, require_number_in
from .verifier_pool import verify

ANSWER_FORMATS = ("number", "boxed")
SCORINGS = ("strict", "lenient")
VERIFY_TIMEOUT_S = 3.0  # per math-verify call; a pathological answer costs at most this
MAX_VERIFY_CHARS = 1000  # longer non-numeric answers are mismatches without being parsed

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_NUMBER_IN_TEXT = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_STRICT_NUMBER = re.compile(_NUMBER_IN_TEXT.pattern, re.ASCII)
"""A strict ``number`` answer: one number in decimal notation, ASCII digits (``-``, thousands commas, decimals);
not a fraction or an expression: "just the number" is what the prompt asks for."""


# ----------------------------------------------------------------------------- extraction

def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` with balanced braces, or None.

    Linear in the text: one pass pairs every ``{`` with its closing ``}``, then the
    ``\\boxed`` occurrences are tried from the last one back (a 100k-character run of
    unclosed ``\\boxed{`` must not cost a scan per occurrence).
    """
    closing: dict[int, int] = {}
    opened: list[int] = []
    for j, char in enumerate(text):
        if char == "{":
            opened.append(j)
        elif char == "}" and opened:
            closing[opened.pop()] = j
    end = len(text)
    while (start := text.rfind("\\boxed", 0, end)) >= 0:
        i = start + len("\\boxed")
        while i < len(text) and text[i] == " ":
            i += 1
        if i in closing and text[i] == "{":
            return text[i + 1:closing[i]]
        end = start
    return None


def extract_answer(completion: str) -> str | None:
    """The last ``\\boxed{...}``'s contents, else the last number, else None."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed.strip()
    match = None
    for match in _NUMBER_IN_TEXT.finditer(completion):  # noqa: B007 - keep the last one
        pass
    return None if match is None else match.group()


def strict_answer(completion: str, answer_format: str) -> str | None:
    """The answer in the form the prompt asks for (``number``: the whole completion is one number in decimal
    notation with ASCII digits, give or take surrounding whitespace and one trailing period, not a fraction;
    ``boxed``: the last ``\\boxed{...}``), else None."""
    require_choice("answer_format", answer_format, ANSWER_FORMATS)
    if answer_format == "boxed":
        boxed = last_boxed(completion)
        return None if boxed is None else boxed.strip()
    text = completion.strip()
    text = text[:-1] if text.endswith(".") else text
    return text if _STRICT_NUMBER.fullmatch(text) else None


def finished_completions(completions: torch.Tensor, mask: torch.Tensor, eos_token_ids: Sequence[int]) -> torch.Tensor:
    """Which completions ended with a stop token within their budget (the rest were truncated).

    ================= ========== ===============================================
    argument          shape      meaning
    ================= ========== ===============================================
    ``completions``   ``[B, T]`` token ids (a :class:`~grpo_lab.protocols.Rollout`'s)
    ``mask``          ``[B, T]`` True on real tokens, through the first EOS
    ``eos_token_ids`` list       the ids that end a completion (the sampler's)
    returns           ``[B]``    True where an EOS is among the real tokens
    ================= ========== ===============================================

    Cut to its first b columns, a rollout gives the completions that finished within b tokens.
    """
    if len(eos_token_ids) == 0:
        raise ValueError("eos_token_ids is empty: no token can end a completion")
    eos = torch.as_tensor(list(eos_token_ids), device=completions.device)
    return (torch.isin(completions, eos) & mask.bool()).any(dim=1)


def _clean(text: str) -> str:
    return text.replace("\\$", "").replace("$", "").replace("\u2212", "-").strip()


def as_number(text: str) -> Fraction | None:
    """The exact value of a plain number (``-1,234.5``, ``0.25``, ``3/4``), else None."""
    s = _clean(text).replace(" ", "")
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    num, slash, den = s.partition("/")
    if not _NUMBER.fullmatch(num) or (slash and not _NUMBER.fullmatch(den)):
        return None
    value = Fraction(Decimal(num))  # via Decimal: no limit on the number of digits
    if slash:
        denominator = Fraction(Decimal(den))
        return None if denominator == 0 else value / denominator
    return value


# ----------------------------------------------------------------------------- rewards

def answers_match(pred: str | None, gold: str, timeout: float = VERIFY_TIMEOUT_S) -> bool:
    """Whether the extracted answer ``pred`` equals ``gold`` (see the module docstring)."""
    if pred is None:
        return False
    pred_value, gold_value = as_number(pred), as_number(gold)
    if pred_value is not None and gold_value is not None:
        return pred_value == gold_value
    pred, gold = _clean(pred), _clean(gold)
    if pred == gold:
        return True
    if not pred or max(len(pred), len(gold)) > MAX_VERIFY_CHARS:
        return False
    return verify(pred, gold, require_number_in("timeout", timeout, 0.0, low_open=True))


def strict_reward(completion: str, finished: bool, gold: str, answer_format: str,
                  timeout: float = VERIFY_TIMEOUT_S) -> float:
    """1.0 if the completion finished and its strict answer matches ``gold``, else 0.0."""
    answer = strict_answer(completion, answer_format)
    return float(bool(finished) and answers_match(answer, gold, timeout))


def lenient_reward(completion: str, gold: str, timeout: float = VERIFY_TIMEOUT_S) -> float:
    """1.0 if the completion's extracted answer (last box, else last number) matches ``gold``, finished
    or not, else 0.0."""
    return float(answers_match(extract_answer(completion), gold, timeout))


def format_reward(completion: str, answer_format: str) -> float:
    """1.0 if the completion has the requested form (a strict answer), else 0.0."""
    return float(strict_answer(completion, answer_format) is not None)


def answer_reward(completion: str, gold: str, answer_format: str = "number", format_weight: float = 0.0,
                  timeout: float = VERIFY_TIMEOUT_S, *, finished: bool = True, scoring: str = "strict") -> float:
    """r(x, y): 1 if correct under ``scoring``, else ``format_weight`` × format reward; in [0, 1].

    ``finished``: whether the completion ended with a stop token within its budget (True for a whole
    text, e.g. an answer of the exact answer space); strict scoring gives a truncated one 0.
    """
    require_number_in("format_weight", format_weight, 0.0, 1.0)
    if require_choice("scoring", scoring, SCORINGS) == "strict":
        if strict_reward(completion, finished, gold, answer_format, timeout):
            return 1.0
        if not finished:
            return 0.0
    elif lenient_reward(completion, gold, timeout):
        return 1.0
    return format_weight * format_reward(completion, answer_format) if format_weight else 0.0


# ----------------------------------------------------------------------------- validation

def require_reward_values(values: Any, prompt_indices: Sequence[int]) -> torch.Tensor:
    """Check the values a reward function returned, one per completion; return them as a float
    tensor ``[N]`` (the step's ``[P, G]`` groups are checked by
    :func:`grpo_lab.checks.require_reward_groups`).

    ``prompt_indices[j]`` is the prompt of completion j. Raises ValueError
    naming the prompt and the value if a value is missing or extra, not a
    real number, NaN/inf or outside [0, 1].
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, torch.Tensor)):
        raise ValueError(f"rewards must be a sequence of numbers, got {type(values).__name__}: {values!r:.80}")
    values = list(values)
    if len(values) != len(prompt_indices):
        j = min(len(values), len(prompt_indices))
        where = (f"no reward for completion {j} (prompt {prompt_indices[j]})" if j < len(prompt_indices)
                 else f"extra value {values[j]!r} beyond the last completion")
        raise ValueError(f"got {len(values)} rewards for {len(prompt_indices)} completions: {where}")
    out = []
    for j, (value, p) in enumerate(zip(values, prompt_indices, strict=True)):
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(value, numbers.Real) or not 0 <= value <= 1:  # NaN fails both
            raise ValueError(f"reward {value!r} for prompt {p} (completion {j}) must be a real number in [0, 1]")
        out.append(float(value))
    return torch.tensor(out, dtype=torch.float32)


def compute_rewards(reward_fn: Callable[[str, Any], float], completions: Sequence[str], targets: Sequence[Any],
                    prompt_indices: Sequence[int]) -> torch.Tensor:
    """``reward_fn(completion, target)`` for each completion, validated by :func:`require_reward_values`.

    ``target`` is whatever ``reward_fn`` checks against (a gold string, a
    Problem). An exception inside ``reward_fn`` becomes a ValueError naming the prompt.
    """
    if not len(completions) == len(targets) == len(prompt_indices):
        raise ValueError(f"completions, targets and prompt_indices must have one length, got "
                         f"{len(completions)}, {len(targets)}, {len(prompt_indices)}")
    values = []
    for j, (completion, target, p) in enumerate(zip(completions, targets, prompt_indices, strict=True)):
        try:
            values.append(reward_fn(completion, target))
        except Exception as exc:
            raise ValueError(f"reward function raised {type(exc).__name__}: {exc} for prompt {p} "
                             f"(completion {j}: {completion[:60]!r})") from exc
    return require_reward_values(values, prompt_indices)
