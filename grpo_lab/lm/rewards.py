"""Verifiable rewards r(x, y) in [0, 1] (docs/theory.md §1), safe in threads and processes.

Definitions (precise, because the reward is the experiment):

* **extracted answer** of a completion: the contents of its last well-formed
  ``\\boxed{...}``; if it has none, its last number (``-?`` digits, thousands
  groups ``1,234`` allowed, optional decimals); if neither, no answer.
* **plain number**: after removing spaces and ``$``, a decimal such as
  ``-12``, ``3.50``, ``1,234`` or a ratio of two such as ``1/2``.
* **answers match** when both are plain numbers with the same exact value
  (``Fraction`` arithmetic: ``0.5 == 1/2``, ``72 == 72.0``, no rounding), or
  they are the same string, or otherwise ``math_verify.verify`` says so
  (``\\frac{1}{2}`` vs ``0.5``, ``(x+1)^2`` vs ``x^2+2x+1``), given at most
  ``timeout`` seconds; a timeout or an answer over MAX_VERIFY_CHARS is a
  mismatch.
* **finished**: the completion ended with a stop (EOS) token within its token
  budget; one cut at the budget is **truncated** (:func:`finished_completions`).
* **strict answer**, in the form the prompt asks for
  (:data:`grpo_lab.lm.tasks.ANSWER_INSTRUCTIONS`): ``number``: the whole
  completion, stripped of surrounding whitespace and of one trailing period,
  is one number (``-?`` digits, thousands groups, optional decimals, optional
  ``/`` and a second such number), so ``"8"``, ``"8."``, ``" 8\\n"``, ``"1,234"``
  pass and ``"6 + 2 = 8"``, ``"8 apples"``, ``"The answer is 8"``, ``"6 2"``,
  ``"8.."``, ``"$8"``, ``"\\boxed{8}"`` do not; ``boxed``: the contents of the
  last ``\\boxed{...}``, with no fallback to the last number.
* **strict reward** (:func:`strict_reward`) = 1 if the completion finished and
  its strict answer matches the gold, else 0. **lenient reward**
  (:func:`lenient_reward`) = 1 if its extracted answer matches, finished or
  not. Lenient credits run-ons (``"6 + 2 = 8 +"``), operand echoes and wrong
  equations whose last number happens to be the gold; strict does not.
* **format reward** = 1 if the completion has a strict answer (the requested form).
  :func:`answer_reward` = 1 if correct under ``scoring`` (``"strict"`` or
  ``"lenient"``), else ``format_weight`` × format (under strict, only if finished).

Why a worker process: math-verify bounds its own work with ``signal.alarm``,
which raises off the main thread, and without it a pathological answer (a power
tower) runs unbounded. Here math-verify runs in one persistent child process
per parent process, on the child's main thread with its own timeouts off; the
parent waits at most ``timeout`` seconds, then kills the child (reward 0,
counted in :func:`verifier_stats`) and hands the next call to a spare child
that has already imported math-verify (and starts a new spare).
"""

from __future__ import annotations

import atexit
import json
import numbers
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from decimal import Decimal
from fractions import Fraction
from typing import Any

import torch

from ..checks import require_choice, require_number_in

ANSWER_FORMATS = ("number", "boxed")
SCORINGS = ("strict", "lenient")
VERIFY_TIMEOUT_S = 3.0  # per math-verify call; a pathological answer costs at most this
STARTUP_TIMEOUT_S = 60.0  # for the worker to import math-verify (slow on a loaded CI machine)
MAX_VERIFY_CHARS = 1000  # longer non-numeric answers are mismatches without being parsed

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_NUMBER_IN_TEXT = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_STRICT_NUMBER = re.compile(rf"{_NUMBER_IN_TEXT.pattern}(?:/{_NUMBER_IN_TEXT.pattern})?")


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
    """The answer in the form the prompt asks for (``number``: the whole completion is one number, give or
    take surrounding whitespace and one trailing period; ``boxed``: the last ``\\boxed{...}``), else None."""
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
    ``completions``   ``[B, T]`` token ids (a :class:`~grpo_lab.rollout.Rollout`'s)
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


# ----------------------------------------------------------------------------- math-verify in a worker

_WORKER = r"""
import json, logging, sys
logging.disable(logging.CRITICAL)  # math-verify logs every unparsable string
from math_verify import parse, verify

def check(pred, gold):
    try:
        return verify(parse("$" + gold + "$", parsing_timeout=None), parse("$" + pred + "$", parsing_timeout=None),
                      timeout_seconds=None)
    except Exception:
        return False

try:
    check("(x+1)^2", "x^2+2x+1")  # warm up sympy so that the first real call is not slower
    sys.stdout.write("ready\n"); sys.stdout.flush()
    for line in sys.stdin:
        sys.stdout.write("1\n" if check(*json.loads(line)) else "0\n"); sys.stdout.flush()
except (BrokenPipeError, KeyboardInterrupt):  # the parent went away
    pass
"""


class _Worker:
    """One math-verify child process: started at once, ready once it has printed ``ready``."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, bufsize=0)
        self.ready = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def readline(self, timeout: float) -> bytes | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], max(timeout, 0.0))
        return self.proc.stdout.readline() if ready else None

    def wait_ready(self, timeout: float) -> bool:
        """Whether the worker has imported math-verify, waiting at most ``timeout`` seconds for it."""
        if not self.ready:
            self.ready = self.readline(timeout) == b"ready\n"
        return self.ready

    def detach(self) -> None:
        """Close this end of the pipes without killing the process (a forked child's copy)."""
        self.proc.stdin.close()
        self.proc.stdout.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.detach()


class _Verifier:
    """One math-verify worker per parent process, calls serialised by a lock.

    After the first kill (a timeout or a crash) a spare worker is kept started, so the
    call after a kill does not wait for math-verify's import (seconds) on top of its own time.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.lock = threading.Lock()
        self.worker: _Worker | None = None
        self.spare: _Worker | None = None
        self.stats: Counter[str] = Counter()

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's workers (without killing them) and the lock."""
        for worker in (self.worker, self.spare):
            if worker is not None:
                worker.detach()
        self._reset()

    def _start(self) -> _Worker:
        self.stats["starts"] += 1
        return _Worker()

    def _take_spare(self) -> _Worker:
        """The spare worker if it is alive (it is no longer the spare), else a new worker."""
        spare, self.spare = self.spare, None
        return spare if spare is not None and spare.alive() else self._start()

    def warm(self) -> bool:
        """Whether the next call is answered by a worker that has already imported math-verify."""
        return self.worker is not None and self.worker.alive() and self.worker.wait_ready(0.0)

    def verify(self, pred: str, gold: str, timeout: float) -> bool:
        with self.lock:
            if self.worker is None or not self.worker.alive():
                self.worker = self._take_spare()
            if not self.worker.wait_ready(STARTUP_TIMEOUT_S):
                self.worker.kill()
                self.worker = None
                raise RuntimeError("the math-verify worker did not start; is math-verify installed?")
            self.stats["calls"] += 1
            start = time.perf_counter()
            try:
                self.worker.proc.stdin.write((json.dumps([pred, gold]) + "\n").encode())
                answer = self.worker.readline(timeout)
            except BrokenPipeError:
                answer = b""
            if answer in (b"1\n", b"0\n"):
                self.stats["max_ms"] = max(self.stats["max_ms"], round(1000 * (time.perf_counter() - start)))
                return answer == b"1\n"
            self.stats["timeouts" if answer is None else "crashes"] += 1
            self.worker.kill()
            self.worker = self._take_spare()
            self.spare = self._start()
            return False

    def close(self) -> None:
        with self.lock:
            for worker in (self.worker, self.spare):
                if worker is not None:
                    worker.kill()
            self.worker = self.spare = None


_VERIFIER = _Verifier()
os.register_at_fork(after_in_child=_VERIFIER.forget_after_fork)
atexit.register(_VERIFIER.close)


def verifier_stats() -> dict[str, int]:
    """Counts of this process's math-verify worker: ``calls``, ``timeouts``,
    ``crashes``, ``starts`` and the slowest answered call ``max_ms``."""
    return {key: _VERIFIER.stats[key] for key in ("calls", "timeouts", "crashes", "starts", "max_ms")}


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
    return _VERIFIER.verify(pred, gold, require_number_in("timeout", timeout, 0.0, low_open=True))


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
