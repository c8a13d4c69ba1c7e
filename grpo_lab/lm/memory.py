"""Memory guard: estimate an LLM run's peak memory before it starts; plan a smaller micro-batch or refuse.

:func:`plan_memory` runs inside :func:`grpo_lab.lm.build.build_loop`, once π_θ is loaded and before anything
else is allocated: it estimates the bytes the run will add, compares them with what the device has available,
and either plans a smaller micro-batch (printing why) or raises a ValueError stating estimate vs available,
instead of an out-of-memory kill minutes into the run.

What a run adds to π_θ's weights W (already resident), sampling and training added, not overlapped::

    new = α + π_ref + gradients + optimiser + autocast + overhead + sampling + training

=========== ================================================== ==============================
part        bytes                                              held
=========== ================================================== ==============================
α           W (HFSampler's deep copy)                          always
π_ref       W                                                  β > 0
gradients   W_train                                            from the first backward
optimiser   2·W_train (AdamW's m and v, the parameters' dtype) AdamW (SGD keeps none)
autocast    W_train·b_c/b (autocast's copies of the weights)   mixed precision (b_c < b)
overhead    c_W·W (allocator slack, weights paged in,          always
            gradient temporaries)
sampling    2·L·B·S·n_kv·d_head·b (KV cache)                   while sampling
            + P·Lp·(4H + 3I)·b (one prefill layer)
            + (b + 20)·B·V (one decoding step's logits)
            + :data:`HEAP_RETENTION`·B·T·V (the C heap's)
training    m·S·L·((10H + 4I)·b + 2·n_head·S·b) (activations)  one micro-batch's forward
            + 3·4·m·T·V (float32 logits, gradient, softmax)    and backward
=========== ================================================== ==============================

B = P·G sequences (P prompts), Lp the longest prompt, T = ``max_completion_length``, S = Lp + T, m the
micro-batch, b bytes per weight element (b_c under autocast), c_W = :data:`C_OVERHEAD_W`; L, H, I, V,
n_head, n_kv, d_head from the model's config (:class:`ModelShape`). Why each term, the heap's retention and
the calibration (:data:`CALIBRATION`): docs/internals.md#memory-guard.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checks import require_int_at_least
from ..config import GRPOConfig

C_OVERHEAD_W = 2.45
"""What the measured peaks exceed the other parts by, at most, in units of W (see CALIBRATION)."""
HEAP_RETENTION = 8
"""Bytes per B·V entry and decoded step that the C heap may keep from the sampler's per-step tensors: above
the most measured, 4.75 (docs/internals.md#memory-guard; docs/decisions.md, Memory)."""
BUDGET_FRACTION = 0.9
"""Plan to use at most this share of the available memory (other processes, estimate error)."""
CALIBRATION = (
    "SmolLM2-135M, float32, CPU (W = 513 MiB, Lp = 46, T = 8, AdamW): peak RSS of two real steps above "
    "the RSS with the model loaded, 11 fresh processes, (B, m) in {(8, 4), (8, 8), (16, 16), (32, 8), "
    "(32, 16), (32, 32)} and β = 0.1: 2.9–5.5 GiB; the parts above leave a residue of 0.9–2.4 W "
    "(allocator fragmentation varies run to run by ±0.25 GiB), so c_W = 2.45 makes the estimate an "
    "upper envelope: measured / estimated = 0.81–1.00 (0.63 with T = 32 budgeted, where every "
    "completion stopped at EOS long before T). Fitted with the earlier sampling term (4·B·T·V, prefill of B "
    "rows); today's adds (b + 20)·B·V + 4·B·T·V and prefills P rows: 0.00–0.05 GiB more at those shapes, so "
    "the envelope holds (not re-measured)")


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs from a causal LM: bytes and its config's sizes."""

    weights: int          # W: parameters + buffers, each shared tensor once
    trainable: int        # W_train: parameters with requires_grad
    element_size: int     # b: bytes per element of the floating weights
    layers: int           # L
    hidden: int           # H
    intermediate: int     # I
    vocab: int            # V
    heads: int            # n_head
    kv_heads: int         # n_kv
    head_dim: int         # d_head
    compute_element_size: int | None = None  # b_c: bytes per element the forward computes in (None: b)

    @property
    def compute_bytes(self) -> int:
        """b_c: bytes per element the forward computes in."""
        return self.compute_element_size or self.element_size

    @classmethod
    def of(cls, model: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> ModelShape:
        """Read the shape of a ``transformers`` causal LM (its text config for multimodal ones), whose forward
        computes in ``compute_dtype`` (None: its weights')."""
        config = model.config.get_text_config()
        params = list(model.parameters())
        tensors = {id(t): t for t in [*params, *model.buffers()]}
        floating = next((p for p in params if p.is_floating_point()), None)
        if floating is None:
            raise ValueError(f"model {type(model).__name__} has no floating-point parameters")
        heads = config.num_attention_heads
        return cls(weights=sum(t.numel() * t.element_size() for t in tensors.values()),
                   trainable=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
                   element_size=floating.element_size(), layers=config.num_hidden_layers,
                   hidden=config.hidden_size, intermediate=getattr(config, "intermediate_size", 4 * config.hidden_size),
                   vocab=config.vocab_size, heads=heads,
                   kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                   head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                   compute_element_size=None if compute_dtype is None else compute_dtype.itemsize)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a run adds to the loaded π_θ, by part (the table in the module docstring)."""

    sampler: int
    reference: int
    gradients: int
    optimizer: int
    autocast: int
    overhead: int
    sampling: int
    training: int

    @property
    def new(self) -> int:
        """Peak bytes added on top of π_θ's weights."""
        return (self.sampler + self.reference + self.gradients + self.optimizer + self.autocast + self.overhead
                + self.sampling + self.training)

    def summary(self) -> str:
        """``new`` and each part, in GiB."""
        parts = ", ".join(f"{name} {gib(getattr(self, name))}" for name in
                          ("sampler", "reference", "gradients", "optimizer", "autocast", "overhead", "sampling",
                           "training"))
        return f"{gib(self.new)} ({parts})"


def estimate_memory(shape: ModelShape, config: GRPOConfig, prompt_length: int,
                    micro_batch_size: int | None = None) -> MemoryEstimate:
    """The bytes a run of ``config`` adds to the loaded model (see the module docstring).

    ``micro_batch_size`` overrides ``config.micro_batch_size`` (None: the config's, else the whole batch).
    """
    require_int_at_least("prompt_length", prompt_length, 1)
    if config.max_completion_length is None:
        raise ValueError("max_completion_length must be set to estimate an LLM run's memory, got None")
    P, T, b = config.prompts_per_step, config.max_completion_length, shape.element_size
    B = P * config.G
    m = min(micro_batch_size or config.micro_batch_size or B, B)
    S, L, H, I, V = prompt_length + T, shape.layers, shape.hidden, shape.intermediate, shape.vocab
    sampling = sampler_tensor_bytes(shape, B, P, prompt_length, T) + HEAP_RETENTION * B * T * V
    training = m * S * L * ((10 * H + 4 * I) * b + 2 * shape.heads * S * b) + 3 * 4 * m * T * V
    b_c = shape.compute_bytes
    return MemoryEstimate(
        sampler=shape.weights, reference=shape.weights if config.beta > 0 else 0, gradients=shape.trainable,
        optimizer=2 * shape.trainable if config.optimizer == "adamw" else 0,
        autocast=shape.trainable // b * b_c if b_c < b else 0,
        overhead=math.ceil(C_OVERHEAD_W * shape.weights), sampling=sampling, training=training)


def sampler_tensor_bytes(shape: ModelShape, B: int, P: int, prompt_length: int, T: int) -> int:
    """The tensors the sampler holds at once (the sampling row without the heap's retention): B = P·G rows
    decoded up to T tokens after prompts of ``prompt_length``."""
    b = shape.element_size
    kv_cache = 2 * shape.layers * B * (prompt_length + T) * shape.kv_heads * shape.head_dim * b
    prefill_layer = P * prompt_length * (4 * shape.hidden + 3 * shape.intermediate) * b
    return kv_cache + prefill_layer + (b + 20) * B * shape.vocab


@dataclass(frozen=True)
class MemoryPlan:
    """What :func:`plan_memory` decided: the micro-batch the run uses on this device, and why."""

    micro_batch_size: int        # m: rows per forward and backward
    estimate: MemoryEstimate     # the bytes the run adds at that m
    available: int               # bytes the device had
    shrunk: bool                 # m is below what the config asked for


def plan_memory(config: GRPOConfig, model: torch.nn.Module, prompt_length: int,
                available: int | None = None, compute_dtype: torch.dtype | None = None) -> MemoryPlan:
    """The micro-batch a run of ``config`` can use in ``available`` bytes (default: :func:`available_memory` of
    the model's device): the config's (or the whole batch) if it fits, else the largest that fits (printed),
    else ValueError. The config is not changed: the loop takes the plan's micro-batch
    (:class:`~grpo_lab.loop.GRPOLoop`'s ``micro_batch_size``). ``compute_dtype``: the dtype π_θ's forward computes
    in (None: its weights')."""
    shape, device = ModelShape.of(model, compute_dtype), next(model.parameters()).device
    available = available_memory(device) if available is None else require_int_at_least("available", available, 0)
    budget = int(BUDGET_FRACTION * available)
    B = config.prompts_per_step * config.G
    m = min(config.micro_batch_size or B, B)
    estimate = estimate_memory(shape, config, prompt_length, m)
    if estimate.new <= budget:
        return MemoryPlan(m, estimate, available, shrunk=False)
    fits = next((k for k in range(m - 1, 0, -1) if estimate_memory(shape, config, prompt_length, k).new <= budget),
                None)
    if fits is None:
        smallest = estimate_memory(shape, config, prompt_length, 1)
        raise ValueError(
            f"memory guard: the run needs about {smallest.summary()} on {device} beyond the loaded weights "
            f"even with micro_batch_size = 1, but only {gib(available)} is available "
            f"(planning with {BUDGET_FRACTION:.0%}); lower prompts_per_step·G = {B}, "
            f"max_completion_length = {config.max_completion_length}, or use a smaller model or dtype")
    print(f"memory guard: micro_batch_size {config.micro_batch_size} → {fits}: the run would need about "
          f"{gib(estimate.new)} on {device} beyond the loaded weights with {m} sequences per forward, "
          f"{gib(available)} is available")
    return MemoryPlan(fits, estimate_memory(shape, config, prompt_length, fits), available, shrunk=True)


def longest_prompt(tokenizer: Any, prompts: Any) -> int:
    """Tokens in the longest of the already-formatted ``prompts`` (the sampler pads to it)."""
    ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError("prompts is empty: no prompt length to plan memory for")
    return max(len(row) for row in ids)


def available_memory(device: torch.device | str = "cpu") -> int:
    """Bytes that can still be allocated: free CUDA memory (plus torch's cached, unused
    blocks) on a GPU; else the system's available RAM, capped by a cgroup limit (containers)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    import psutil

    return min(psutil.virtual_memory().available, _cgroup_headroom())


def _cgroup_headroom() -> int:
    """A cgroup's limit minus its usage (reclaimable file cache excluded); no limit: a huge number."""
    root = Path("/sys/fs/cgroup")
    for limit_file, usage_file, inactive_key in (
            ("memory.max", "memory.current", "inactive_file"),                              # cgroup v2
            ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "total_inactive_file")):  # v1
        try:
            limit = (root / limit_file).read_text().strip()
            usage = int((root / usage_file).read_text())
            stat = (root / limit_file).with_name("memory.stat").read_text().split("\n")
        except (OSError, ValueError):
            continue
        inactive = next((int(line.split()[1]) for line in stat if line.startswith(inactive_key + " ")), 0)
        return 2**63 if limit == "max" else max(int(limit) - (usage - inactive), 0)
    return 2**63


def gib(n: int) -> str:
    """Bytes as GiB with two decimals (``'1.25 GiB'``)."""
    return f"{n / 2**30:.2f} GiB"


MMAP_THRESHOLD = 256 * 2**10
"""Bytes from which :func:`map_large_blocks` gives an allocation its own mapping."""
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number for the mmap threshold (``malloc.h``)."""


def map_large_blocks(threshold: int = MMAP_THRESHOLD) -> bool:
    """From now on in this process, have glibc give every allocation of ``threshold`` bytes or more its own
    mapping, handed back to the OS when it is freed (``mallopt(M_MMAP_THRESHOLD)``); False where there is no
    glibc. By default glibc raises that threshold (up to 32 MiB) each time such a block is freed, so after a
    first training step the tensors of a step (a layer's gradients and activations, a few MiB each) come from
    its heap and stay in RSS once freed, under the next step's own: a fixed threshold keeps RSS at what the
    live tensors hold, at the cost of zeroing fresh pages for each large allocation (docs/benchmarks.md,
    *Notebook memory*, has what it saved and cost on notebook 02)."""
    import ctypes
    import ctypes.util

    require_int_at_least("threshold", threshold, 1)
    libc = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(libc), "mallopt", None) if libc else None
    return mallopt is not None and mallopt(M_MMAP_THRESHOLD, threshold) == 1


def return_freed_memory() -> None:
    """Collect garbage, then hand the C heap's free pages back to the OS (glibc's ``malloc_trim``; a no-op
    where there is none): what a notebook cell calls after dropping a finished run, so its RSS falls before
    the next run allocates. Without it glibc keeps the freed tensors' pages (:data:`HEAP_RETENTION`;
    docs/internals.md#memory-guard), and a later run's peak lands on top of them."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    if trim is not None:
        trim(0)


