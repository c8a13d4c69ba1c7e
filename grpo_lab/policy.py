"""π_θ for language models: a Hugging Face causal LM that scores a rollout's completions (SPEC §3).

The rollout layout is the one :mod:`grpo_lab.sampling` writes (table in its
docstring): left-padded prompt ids with their
mask in ``extra``, right-padded completions with ``mask`` True up to and
including the first EOS. :meth:`LMPolicy.logprobs` runs one forward pass over
prompt + completion with the attention mask and position ids ``generate`` used,
and returns log π_θ of each completion token at temperature T,
``log_softmax(logits / T)`` — the same distribution the sampler drew from, so
the ratio π_θ/α is 1 when θ = α.
"""

from __future__ import annotations

import inspect

import torch

from .checks import require_number_in
from .loop import Rollout


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits) at ``tokens``, without materialising the log-softmax.

    Equation::

        log p(y_t) = logits[t, y_t] − logsumexp_v logits[t, v]

    ========== ============= ===============================================
    symbol     shape         meaning
    ========== ============= ===============================================
    logits     ``[b, T, V]`` next-token scores, already divided by T, float32/64
    tokens     ``[b, T]``    the tokens whose log-probability is wanted
    returned   ``[b, T]``    in the logits' dtype
    ========== ============= ===============================================

    Works row by row (like TRL's ``selective_log_softmax``) so that the only
    ``[T, V]`` temporary is one row's: a full log-softmax of 32 × 128 tokens
    over a 49k vocabulary in float32 would take ~0.8 GB more, and ~10 GB with
    its backward buffers.
    """
    rows = []
    for row_logits, row_tokens in zip(logits, tokens, strict=True):
        selected = row_logits.gather(-1, row_tokens[:, None]).squeeze(-1)
        rows.append(selected - torch.logsumexp(row_logits, dim=-1))
    return torch.stack(rows)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch, as ``generate`` computes them: the
    first real token is position 0 (padding gets 0 too; it is never attended)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class LMPolicy(torch.nn.Module):
    """π_θ: a causal LM (``self.model``) scored at sampling temperature T.

    =============== ==================================================
    attribute       meaning
    =============== ==================================================
    ``model``       a ``transformers`` causal LM whose forward accepts
                    ``logits_to_keep`` (every recent decoder-only model)
    ``temperature`` T > 0: log π = log_softmax(logits / T), as sampled
    =============== ==================================================

    The model is put in eval mode: dropout would make log π a random function
    of θ and break π_θ/α = 1 at θ = α (RL fine-tuning runs without dropout).
    Being an ``nn.Module``, the policy supports ``state_dict``,
    ``load_state_dict`` and ``copy.deepcopy`` (π_ref).
    """

    def __init__(self, model: torch.nn.Module, temperature: float = 1.0) -> None:
        super().__init__()
        if "logits_to_keep" not in inspect.signature(model.forward).parameters:
            raise ValueError(f"model {type(model).__name__} must accept logits_to_keep in forward()")
        self.model = model.eval()
        self.temperature = require_number_in("temperature", temperature, 0.0, low_open=True)

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
        returned       ``[b, T]``     log π_θ, on the rollout's device
        ============== ============== =============================================
        """
        logits = self.completion_logits(rollout, rows)
        return token_logprobs(logits, rollout.completions[rows].to(logits.device)).to(rollout.completions.device)

    def completion_logits(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """The next-token scores / T at every completion position, ``[b, T, V]`` (float32 or float64).

        The forward sees prompt + completion without its last token; the logits
        of the last T positions predict the T completion tokens
        (``logits_to_keep=T``, so the prompt's logits are never computed). As in
        ``generate``, every completion position is attended and positions count
        real tokens only. Positions after EOS hold finite values the loss ignores.
        """
        completions = rollout.completions[rows]
        device, length = self.device, completions.shape[1]
        input_ids = torch.cat([rollout.extra["prompt_ids"][rows], completions[:, :-1]], dim=1).to(device)
        prompt_mask = rollout.extra["prompt_mask"][rows].to(device)
        attention_mask = torch.cat(
            [prompt_mask, torch.ones(completions.shape[0], length - 1, dtype=prompt_mask.dtype, device=device)], dim=1)
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=positions_from_mask(attention_mask), logits_to_keep=length,
                            use_cache=False).logits
        # As generate: upcast to float32 (no copy if it already is), then divide by T. In place
        # is safe: neither lm_head's nor the upcast's backward needs its output.
        logits = logits if logits.dtype == torch.float64 else logits.float()
        if self.temperature != 1.0:
            logits.div_(self.temperature)
        return logits
