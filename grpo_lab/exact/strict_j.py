"""Exact J(π) on a real language model: the probability that one sampled completion scores 1 under strict scoring.

A completion is accepted (:mod:`grpo_lab.exact.strict_answers`) when it is whitespace, a number equal to the
gold, an optional trailing period and whitespace, then a stop token, within T_max tokens. That set is small,
so the probability of drawing it is computed, not sampled::

    J(x) = Σ_{y accepted} α′(y | x),   α′(y | x) = Π_t α′(y_t | x, y_<t)

where α′ is the run's sampling distribution: softmax(logits / T) cut by top-k, then top-p, and renormalised
(:func:`grpo_lab.lm.sampling.truncate_logprobs`). The token tree of completions is walked from the prompt, every
question of a batch at once, each node a row of one KV cache; a branch that can no longer be accepted is rejected
mass, a branch below the threshold τ is **pruned**, so J_low ≤ J ≤ J_low + pruned per question: a certified
bound, relative to the walk's own float32 forward, its tie-keeping top-p cut and "decoding is concatenation"
(checked on short pairs and accepted leaves). A question whose pruned mass exceeds ``max_pruned`` is walked again
at τ/10, down to :data:`THRESHOLD_FLOOR`. The walk, the multi-byte rules and the three conditions of the
certificate in full: docs/internals.md#exact-j.

===================== ============ =================================================================
name                  shape        meaning
===================== ============ =================================================================
``prompts``           Q strings    formatted prompts (chat template applied), as the sampler gets them
``golds``             Q strings    gold answers (plain numbers)
:class:`Sampling`     settings     T, top_p, top_k, T_max of the sampler whose J this is
``threshold``         float        first pruning level τ on a branch's probability
``max_pruned``        float        the pruned mass a question may keep before it is walked at τ/10
returns               3 × ``[Q]``  J_low and the pruned mass (float64), the τ each ended at
===================== ============ =================================================================
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from ..checks import require_int_at_least, require_number_in, require_truncation
from ..lm.decoding import ModelDecoder
from ..lm.sampling import stop_and_pad_ids, truncate_logprobs
from ..lm.tasks import Problem, build_prompt
from .strict_answers import StrictAnswers, answer_char

THRESHOLD = 1e-5
"""Default first τ: branches below this probability are pruned (docs/benchmarks.md gives the pruned mass it leaves)."""
MAX_PRUNED = 1e-3
"""Default bound per question: a question pruned more than this is walked again at τ/10."""
THRESHOLD_FLOOR = 1e-9
"""The lowest τ refinement goes to (a question still above ``max_pruned`` there keeps its bound, reported)."""
QUESTIONS_PER_BATCH = 64
"""Questions walked together (one KV cache). Its memory is the walked nodes of a depth times the prompt's tokens
times the keys and values of a token (SmolLM2-135M: 30 layers × 2 × 3 heads × 64 floats = 45 KiB); larger
batches make each depth's forward wider, so the walk is faster and holds more (docs/benchmarks.md: 8, 32 and 64
compared)."""


@dataclass(frozen=True)
class Sampling:
    """The sampling distribution whose J is computed: the sampler's temperature T, top-p, top-k (1 and 0: off)
    and T_max, the tokens a completion may take, its stop token included."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 64

    def __post_init__(self) -> None:
        require_number_in("temperature", self.temperature, 0.0, low_open=True)
        require_truncation(self.top_p, self.top_k)
        require_int_at_least("max_tokens", self.max_tokens, 1)


@dataclass(frozen=True)
class AnswerTokens:
    """A vocabulary split for the walk (module docstring).

    ``ids``/``pieces``: the candidate children and their bytes: tokens whose decoded text (special tokens
    dropped, as the sampler decodes) consists of :func:`~grpo_lab.exact.strict_answers.answer_char` characters,
    or is empty (its UTF-8), and tokens that hold part of a multi-byte space (:func:`may_be_part_of_a_space`,
    their raw bytes); ``unknown``: tokens that hold part of a multi-byte character but whose bytes cannot be
    read; ``stops``: the stop ids.
    Every other token puts a character into the text that no accepted completion holds.
    """

    stops: list[int]
    ids: torch.Tensor
    pieces: list[bytes]
    unknown: torch.Tensor


def answer_tokens(tokenizer: Any, vocab_size: int, stops: Sequence[int]) -> AnswerTokens:
    """Split the ``vocab_size`` ids of the model's logits, each by its decoded text (ids past the tokenizer's
    vocabulary decode to "", in the sampler's texts too), for a tokenizer whose decoding concatenates token
    texts (checked on every pair of candidate tokens of one or two characters; a ValueError names a pair
    that does not)."""
    texts = tokenizer.batch_decode([[i] for i in range(vocab_size)], skip_special_tokens=True)
    ids, kept, partial, unknown = [], [], [], []
    stop_set = set(stops)
    for i, text in enumerate(texts):
        if i in stop_set or not all(answer_char(c) or c == "\ufffd" for c in text):
            continue
        if "\ufffd" in text:
            raw = token_bytes(tokenizer, i, text)
            if raw is None:
                unknown.append(i)
            elif may_be_part_of_a_space(raw):
                partial.append((i, raw))
        else:
            ids.append(i)
            kept.append(text)
    short = [(i, t) for i, t in zip(ids, kept, strict=True) if len(t) <= 2]
    pairs = [(a, b) for a in short for b in short]
    for ((a, ta), (b, tb)), joined in zip(pairs, tokenizer.batch_decode([[a[0], b[0]] for a, b in pairs],
                                                                       skip_special_tokens=True), strict=True):
        if joined != ta + tb:
            raise ValueError(f"the tokenizer decodes tokens {a} + {b} to {joined!r}, not {ta + tb!r}: exact J "
                             "walks tokens whose decoded texts concatenate")
    pieces = [text.encode() for text in kept] + [raw for _, raw in partial]
    return AnswerTokens(list(stops), torch.tensor(ids + [i for i, _ in partial], dtype=torch.long), pieces,
                        torch.tensor(unknown, dtype=torch.long))


def token_bytes(tokenizer: Any, token_id: int, text: str) -> bytes | None:
    """The raw bytes of a byte-level BPE token (GPT-2's alphabet: one printable character per byte), checked
    against the tokenizer's own decoding ``text`` of it; None for any other tokenizer or token."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if not isinstance(piece, str) or not piece or any(c not in byte_of for c in piece):
        return None
    raw = bytes(byte_of[c] for c in piece)
    return raw if raw.decode("utf-8", errors="replace") == text else None


MULTI_BYTE_SPACES = tuple(chr(c).encode() for c in range(0x80, 0x3001) if chr(c).isspace())
"""The UTF-8 of every Unicode space beyond ASCII (U+0085 … U+3000): the only multi-byte characters an accepted
completion may hold."""
SPACE_PREFIXES = frozenset(w[:n] for w in MULTI_BYTE_SPACES for n in range(1, len(w)))
"""The bytes a node may leave pending: the proper prefixes of a multi-byte space's UTF-8."""


def extend_bytes(pending: bytes, raw: bytes) -> tuple[str, bytes] | None:
    """A token's bytes ``raw`` after a node's ``pending`` bytes: the whole characters they decode to and the bytes
    left pending (a prefix in :data:`SPACE_PREFIXES`, or none); None when they hold an invalid sequence (which
    decodes to U+FFFD) or leave pending bytes that begin no multi-byte space."""
    joined = pending + raw
    for cut in range(min(3, len(joined)) + 1):
        head, tail = joined[:len(joined) - cut], joined[len(joined) - cut:]
        if cut and tail not in SPACE_PREFIXES:
            continue
        try:
            return head.decode("utf-8"), tail
        except UnicodeDecodeError:
            continue
    return None


def may_be_part_of_a_space(raw: bytes) -> bool:
    """Whether a token's bytes may appear in an accepted completion's UTF-8: after no pending bytes or after a
    prefix of a multi-byte space, they decode to answer characters and leave at most such a prefix pending."""
    for pending in (b"", *SPACE_PREFIXES):
        step = extend_bytes(pending, raw)
        if step is not None and all(answer_char(c) for c in step[0]):
            return True
    return False


def viable_with_pending(answer: StrictAnswers, text: str, pending: bytes) -> bool:
    """Whether ``text`` followed by ``pending`` bytes (a space's prefix) may lead to an accepted completion."""
    if not pending:
        return answer.viable(text)
    return any(answer.viable(text + w.decode()) for w in MULTI_BYTE_SPACES if w.startswith(pending))


@dataclass
class _Node:
    question: int
    ids: tuple[int, ...]
    text: str
    p: float
    pending: bytes = b""


@torch.no_grad()
def strict_j(model: torch.nn.Module, tokenizer: Any, prompts: Sequence[str], golds: Sequence[str],
             sampling: Sampling, threshold: float = THRESHOLD, eos_token_ids: Sequence[int] | None = None,
             questions_per_batch: int = QUESTIONS_PER_BATCH,
             max_pruned: float = MAX_PRUNED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(J_low, pruned, τ) per question ``[Q]``: the walk of the module docstring, J_low ≤ J ≤ J_low + pruned,
    each question refined until its pruned mass is ≤ ``max_pruned`` (or τ reaches :data:`THRESHOLD_FLOOR`).

    ``eos_token_ids``: the stop ids (None: the model's, as the sampler takes them,
    :func:`~grpo_lab.lm.sampling.stop_and_pad_ids`).
    """
    if len(prompts) == 0 or len(prompts) != len(golds):
        raise ValueError(f"need one gold per prompt and at least one prompt, got {len(prompts)} prompts and "
                         f"{len(golds)} golds")
    require_number_in("threshold", threshold, 0.0, 1.0)
    require_number_in("max_pruned", max_pruned, 0.0, 1.0)
    require_int_at_least("questions_per_batch", questions_per_batch, 1)
    stops, pad = stop_and_pad_ids(model, tokenizer, eos_token_ids)
    tokens = answer_tokens(tokenizer, model.get_output_embeddings().weight.shape[0], stops)
    answers = [StrictAnswers(gold) for gold in golds]
    walk = _Walk(model, tokenizer, tokens, sampling, pad)
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    walk.prefill_prefix(_common_prefix(encoded))
    j_low, pruned, taus = np.zeros(len(prompts)), np.zeros(len(prompts)), np.full(len(prompts), threshold)
    todo = np.arange(len(prompts))
    while todo.size:
        for start in range(0, todo.size, questions_per_batch):
            batch = todo[start:start + questions_per_batch]
            j_batch, pruned_batch = np.zeros(batch.size), np.zeros(batch.size)
            walk.run([encoded[q] for q in batch], [answers[q] for q in batch], j_batch, pruned_batch, taus[batch[0]])
            j_low[batch], pruned[batch] = j_batch, pruned_batch
        todo = todo[(pruned[todo] > max_pruned) & (taus[todo] / 10 >= THRESHOLD_FLOOR)]
        taus[todo] /= 10
    return j_low, pruned, taus


def _common_prefix(encoded: Sequence[Sequence[int]]) -> list[int]:
    """The token ids every prompt starts with, leaving each prompt at least one token of its own."""
    first, n = encoded[0], min(len(e) for e in encoded) - 1
    for ids in encoded[1:]:
        n = next((i for i in range(n) if ids[i] != first[i]), n)
    return list(first[:n])


class _Walk:
    """The walk of the module docstring over one batch of questions at a time, sharing one prefilled prefix."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, tokens: AnswerTokens, sampling: Sampling,
                 pad: int) -> None:
        self.model, self.tokenizer, self.tokens = model, tokenizer, tokens
        self.sampling, self.pad = sampling, pad
        self.cache_kwarg = ModelDecoder(model).cache_kwarg
        self.device = next(model.parameters()).device
        self.prefix: list[int] = []
        self.prefix_cache: Any = None
        self.viable: dict[tuple[str, str, bytes], tuple[np.ndarray, dict[int, tuple[str, bytes]]]] = {}

    def forward(self, ids: torch.Tensor, key_mask: torch.Tensor, positions: torch.Tensor,
                cache: Any) -> tuple[torch.Tensor, Any]:
        """Logits ``[B, V]`` at the last of ``ids [B, S]`` and the cache holding their keys and values."""
        kwargs = {} if cache is None else {self.cache_kwarg: cache}
        out = self.model(input_ids=ids.to(self.device), attention_mask=key_mask.to(self.device),
                         position_ids=positions.to(self.device), use_cache=True, logits_to_keep=1, **kwargs)
        return out.logits[:, -1], getattr(out, self.cache_kwarg)

    def prefill_prefix(self, prefix: list[int]) -> None:
        """Keys and values of the prompts' shared first tokens, computed once."""
        self.prefix = prefix
        if prefix:
            ids = torch.tensor([prefix])
            _, self.prefix_cache = self.forward(ids, torch.ones_like(ids), torch.arange(len(prefix))[None], None)

    def run(self, encoded: list[list[int]], answers: list[StrictAnswers], j_low: np.ndarray,
            pruned: np.ndarray, threshold: float) -> None:
        """Walk one batch of prompts (token ids) pruning below ``threshold``, adding into ``j_low`` and ``pruned``
        (one entry per prompt)."""
        n, rows = len(self.prefix), len(encoded)
        suffixes = [ids[n:] for ids in encoded]
        width = max(len(s) for s in suffixes)
        ids = torch.full((rows, width), self.pad, dtype=torch.long)
        key_mask = torch.zeros(rows, n + width, dtype=torch.long)
        key_mask[:, :n] = 1
        positions = torch.full((rows, width), n, dtype=torch.long)
        for r, suffix in enumerate(suffixes):  # left-padded after the shared prefix
            ids[r, width - len(suffix):] = torch.tensor(suffix)
            key_mask[r, n + width - len(suffix):] = 1
            positions[r, width - len(suffix):] = torch.arange(n, n + len(suffix))
        cache = None
        if self.prefix_cache is not None:
            cache = copy.deepcopy(self.prefix_cache)
            cache.batch_repeat_interleave(rows)
        logits, cache = self.forward(ids, key_mask, positions, cache)
        nodes = [_Node(q, (), "", 1.0) for q in range(rows)]
        next_position = torch.tensor([len(e) for e in encoded])
        for depth in range(self.sampling.max_tokens):
            children, parents = self.expand(logits, nodes, answers, j_low, pruned, threshold,
                                            last=depth == self.sampling.max_tokens - 1)
            if not children:
                return
            index = torch.tensor(parents)
            cache.reorder_cache(index.to(self.device))
            key_mask = torch.cat([key_mask[index], torch.ones(len(index), 1, dtype=torch.long)], dim=1)
            logits, cache = self.forward(torch.tensor([[c.ids[-1]] for c in children]), key_mask,
                                         next_position[index][:, None], cache)
            nodes, next_position = children, next_position[index] + 1

    def expand(self, logits: torch.Tensor, nodes: list[_Node], answers: list[StrictAnswers], j_low: np.ndarray,
               pruned: np.ndarray, threshold: float, last: bool) -> tuple[list[_Node], list[int]]:
        """Book each node's stop mass and pruned mass; return its children to expand and their parents' rows."""
        s, tokens = self.sampling, self.tokens
        logp = truncate_logprobs(torch.log_softmax(logits.float() / s.temperature, dim=-1), s.top_p, s.top_k)
        probs = logp.double().exp()
        probs /= probs.sum(-1, keepdim=True)  # as the sampler draws: exp(log α′) over its total, in float64
        stop = probs[:, tokens.stops].sum(-1).cpu().numpy()
        unknown = probs[:, tokens.unknown.to(probs.device)].sum(-1).cpu().numpy()
        candidates = probs[:, tokens.ids.to(probs.device)].cpu().numpy()
        children, parents = [], []
        for r, node in enumerate(nodes):
            answer = answers[node.question]
            if not node.pending and answer.accepts(node.text):
                self.check_decoding(node)
                j_low[node.question] += node.p * stop[r]
            if last:
                continue
            mass = node.p * candidates[r]
            viable, grown = self.viable_children(answer, node.text, node.pending)
            walked = viable & (mass >= threshold) & (mass > 0)
            pruned[node.question] += node.p * unknown[r] + mass[viable & ~walked].sum()
            for c in np.flatnonzero(walked):
                text, pending = grown[c]
                children.append(_Node(node.question, (*node.ids, int(tokens.ids[c])), text, float(mass[c]), pending))
                parents.append(r)
        return children, parents

    def check_decoding(self, node: _Node) -> None:
        """The tokenizer decodes an accepted node's tokens to the text the walk scored, or a ValueError says not."""
        decoded = self.tokenizer.decode(list(node.ids), skip_special_tokens=True)
        if decoded != node.text:
            raise ValueError(f"tokens {list(node.ids)} decode to {decoded!r}, not to the concatenation of their texts "
                             f"{node.text!r}: exact J walks tokens whose decoded texts concatenate")

    def viable_children(self, answer: StrictAnswers, text: str,
                        pending: bytes) -> tuple[np.ndarray, dict[int, tuple[str, bytes]]]:
        """Which candidate tokens ``[C]`` may follow ``text`` and ``pending`` bytes on the way to an accepted
        completion, and the text and pending bytes each of those leads to (memoised: many nodes of many questions
        share a gold, a text and pending bytes)."""
        key = (answer.gold, text, pending)
        if key not in self.viable:
            pieces, grown = self.tokens.pieces, {}
            for c, raw in enumerate(pieces):
                step = extend_bytes(pending, raw)
                if step is not None and viable_with_pending(answer, text + step[0], step[1]):
                    grown[c] = (text + step[0], step[1])
            viable = np.zeros(len(pieces), bool)
            viable[list(grown)] = True
            self.viable[key] = viable, grown
        return self.viable[key]


@dataclass
class ExactEvaluation:
    """Exact strict Pass@1 of a policy on a list of problems: per question J_low and the pruned mass
    (J_low ≤ J ≤ J_low + pruned), with the sampling settings and τ they were computed under."""

    rows: list[dict[str, Any]]
    """One per problem: ``question``, ``prompt`` (the whole text fed to the model), ``gold``, ``j_low``, ``pruned``,
    and ``threshold``, the τ its walk ended at."""
    sampling: Sampling
    threshold: float
    """The first τ."""
    max_pruned: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def j_low(self) -> np.ndarray:
        return np.array([row["j_low"] for row in self.rows])

    @property
    def pruned(self) -> np.ndarray:
        return np.array([row["pruned"] for row in self.rows])

    @property
    def mean(self) -> float:
        """J_low averaged over the questions (the mean J lies in [mean, mean + mean pruned])."""
        return float(self.j_low.mean())

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``grpo-lab eval --exact --out``: mean, bound, settings beside the rows."""
        return {"evaluation": "exact", "mean_j_low": self.mean, "mean_pruned": float(self.pruned.mean()),
                "max_pruned": float(self.pruned.max()), **asdict(self.sampling), "threshold": self.threshold,
                "max_pruned_target": self.max_pruned, **self.extra, "rows": self.rows}


def exact_evaluate(model: torch.nn.Module, tokenizer: Any, problems: Sequence[Problem], sampling: Sampling,
                   threshold: float = THRESHOLD, system_prompt: str | None = None,
                   eos_token_ids: Sequence[int] | None = None,
                   questions_per_batch: int = QUESTIONS_PER_BATCH, max_pruned: float = MAX_PRUNED) -> ExactEvaluation:
    """Exact strict Pass@1 of the causal LM ``model`` on ``problems`` (answer format ``number``), their prompts
    built as a run builds them (:func:`~grpo_lab.lm.tasks.build_prompt`); no training config involved."""
    wrong = sorted({p.answer_format for p in problems} - {"number"})
    if wrong:
        raise ValueError(f"exact J covers the answer format 'number' only, got problems in {wrong}")
    prompts = [build_prompt(p, tokenizer, system_prompt) for p in problems]
    j_low, pruned, taus = strict_j(model, tokenizer, prompts, [p.answer for p in problems], sampling, threshold,
                                   eos_token_ids, questions_per_batch, max_pruned)
    rows = [{"question": p.question, "prompt": prompt, "gold": p.answer, "j_low": float(j), "pruned": float(b),
             "threshold": float(t)} for p, prompt, j, b, t in zip(problems, prompts, j_low, pruned, taus, strict=True)]
    return ExactEvaluation(rows, sampling, threshold, max_pruned)
