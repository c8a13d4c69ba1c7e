"""The completions strict scoring accepts for a gold number, and the prefixes that can still become one.

:func:`grpo_lab.lm.rewards.strict_reward` (answer format ``number``) accepts a finished completion when,
stripped of surrounding whitespace and of one trailing period, it is one number in decimal notation with
ASCII digits (``-?``, digits with optional thousands commas, optional decimals) whose value equals the
gold's. So for the gold 8 it accepts ``"8"``, ``" 8."``, ``"08\\n"``, ``"8.00"`` and ``"0,008"``, and not
``"16/2"`` or ``"٨"``.

:class:`StrictAnswers` answers two questions about a decoded text for one gold:

* :meth:`~StrictAnswers.accepts`: does the completion ``text`` + stop score 1? It *is*
  ``strict_reward(text, finished=True, ...)``, so the walk of :mod:`grpo_lab.exact.strict_j` and the
  sampled reward can never disagree.
* :meth:`~StrictAnswers.viable`: may some continuation of ``text`` be accepted? Exact and value-aware:
  ``"1"`` is not viable for the gold 8, ``"0"`` is (``"08"``). A branch wrongly called viable would only
  cost work; one wrongly called dead would lose accepted mass (the tests enumerate both against
  ``strict_reward``).
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

from ..lm.rewards import as_number, strict_reward

DIGITS = "0123456789"
PUNCTUATION = ".,-"
"""The characters of a strict number besides digits: decimal point or trailing period, thousands comma,
minus sign."""


def answer_char(char: str) -> bool:
    """Whether ``char`` may appear in an accepted completion: whitespace (``str.strip``'s), an ASCII digit
    or one of :data:`PUNCTUATION`."""
    return char.isspace() or char in DIGITS or char in PUNCTUATION


@lru_cache(maxsize=4096)
def decimal_digits(value: Fraction) -> tuple[str, str] | None:
    """|value| as (integer digits, decimals without trailing zeros), e.g. 5/4 → ("1", "25"); None when it
    has no finite decimal expansion (1/3)."""
    v, scale = abs(value), 0
    while (10**scale) % v.denominator:
        if scale > 4 * v.denominator.bit_length():  # only 2s and 5s divide a power of 10
            return None
        scale += 1
    digits = str(v.numerator * (10**scale // v.denominator)).rjust(scale + 1, "0")
    return digits[:len(digits) - scale], digits[len(digits) - scale:].rstrip("0")


def _integer_part_ok(part: str, integer: str | None, complete: bool) -> bool:
    """Whether ``part`` is (``complete``) or begins (not ``complete``) an integer part ``\\d+`` or
    ``\\d{1,3}(,\\d{3})+`` of the value whose digits are ``integer`` (None: any value)."""
    groups = part.split(",")
    if any(c not in DIGITS for c in part.replace(",", "")):
        return False
    if len(groups) > 1 and (not 1 <= len(groups[0]) <= 3 or any(len(g) != 3 for g in groups[1:-1])
                            or len(groups[-1]) > 3 or (complete and len(groups[-1]) != 3)):
        return False
    digits = "".join(groups)
    if complete and not digits:
        return False
    if integer is None:
        return True
    written, wanted = digits.lstrip("0"), integer.lstrip("0")
    if complete:
        return written == wanted
    if not wanted.startswith(written):
        return False
    # after a comma the digits still to come are fixed (leading zeros are over): they must close the groups
    return len(groups) == 1 or not written or (len(groups[-1]) + len(wanted) - len(written)) % 3 == 0


def _decimals_ok(decimals: str, wanted: str | None) -> bool:
    """Whether ``decimals`` begins decimals of the value whose decimals are ``wanted`` (then zeros)."""
    if any(c not in DIGITS for c in decimals):
        return False
    return wanted is None or all(c == (wanted[i] if i < len(wanted) else "0") for i, c in enumerate(decimals))


def plain_prefix(text: str, value: Fraction | None) -> bool:
    """Whether ``text`` (ASCII digits, no whitespace) is or begins a plain number ``-?`` integer part,
    optional decimals, optional trailing period, of value ``value`` (None: of any value)."""
    wanted = (None, None) if value is None else decimal_digits(value)
    if wanted is None:
        return False
    integer, decimals = wanted
    if text.startswith("-"):
        if value is not None and value > 0:
            return False
        text = text[1:]
    elif value is not None and value < 0 and text:
        return False
    if not text:
        return True
    head, dot, tail = text.partition(".")
    if not dot:
        return _integer_part_ok(head, integer, complete=False)
    if not _integer_part_ok(head, integer, complete=True):
        return False
    if tail.endswith("."):  # decimals, then the trailing period: nothing but whitespace may follow
        tail = tail[:-1]
        return bool(tail) and _decimals_ok(tail, decimals) and (decimals is None or len(tail) >= len(decimals))
    return _decimals_ok(tail, decimals)  # "": the trailing period, or decimals to come


class StrictAnswers:
    """The accepted completions of one gold answer (a plain number: ``"8"``, ``"-3"``, ``"2.5"``, ``"1/3"``)."""

    def __init__(self, gold: str) -> None:
        value = as_number(gold) if isinstance(gold, str) else None
        if value is None:
            raise ValueError(f"exact J needs a plain-number gold answer (format 'number'), got {gold!r}")
        self.gold, self.value = gold, value
        self._accepts: dict[str, bool] = {}
        self._viable: dict[str, bool] = {}

    def accepts(self, text: str) -> bool:
        """Whether the completion ``text`` followed by a stop token scores 1 (``strict_reward``, finished)."""
        if text not in self._accepts:
            self._accepts[text] = strict_reward(text, True, self.gold, "number") == 1.0
        return self._accepts[text]

    def viable(self, text: str) -> bool:
        """Whether some continuation of ``text`` (possibly none) is accepted."""
        if text not in self._viable:
            self._viable[text] = self._viable_uncached(text)
        return self._viable[text]

    def _viable_uncached(self, text: str) -> bool:
        core = text.lstrip()
        if not core:
            return True
        answer = core.rstrip()
        if answer != core:  # whitespace after the answer: only whitespace may follow
            return self.accepts(answer)
        if not all(answer_char(c) and not c.isspace() for c in answer):
            return False
        return plain_prefix(answer, self.value)
