"""Memory guard: plan an LLM run's memory on its device before it starts; a smaller micro-batch, or a refusal.

:func:`plan_memory` runs inside :func:`grpo_lab.lm.build.build_loop`, once π_θ is loaded and before anything
else is allocated: it estimates the bytes the run will add on π_θ's device, compares them with what that device
has free and either plans a smaller micro-batch (printing why) or raises a ValueError naming the figure that does
not fit, instead of an out-of-memory kill minutes into the run. :func:`plan_for` makes the same plan without the
device: for a recorded one (:data:`DEVICES`) and a :class:`Layout` (the loop or the TRL adapter, one replica or
ZeRO-3 shards per process, where α's vLLM engine is); :func:`grpo_lab.scale.launch.plan_launch` makes it for a
TRL-route launch before π_θ is loaded.

What one process adds to π_θ's weights (already resident: W, or W/N_s under ZeRO-3), sampling and training
added, not overlapped::

    new = α + π_ref + gradients + optimiser + autocast + gathered + overhead + sampling + training

=========== =============================================== ===============================================
part        bytes, one process                              held, and where
=========== =============================================== ===============================================
α           W                                               a torch copy of α: the loop's (HFSampler's, or
                                                            VLLMSampler's scorer); TRL's without vLLM
π_ref       W/N_s                                           β > 0
gradients   W_t/N_s, twice under DDP (N > 1, N_s = 1)       from the first backward (DDP: its buckets)
optimiser   2·W_t/N_s (AdamW's m and v)                     AdamW (SGD keeps none)
autocast    W_t·b_c/(b·N_s) (the weights in b_c)            mixed precision (b_c < b)
gathered    min(:data:`ZERO3_LIVE_PARAMETERS`, W/b)·b_c     ZeRO-3 (N_s > 1): weights gathered for a forward
overhead    c_W·W/N_s (allocator slack, weights paged in,   always
            gradient and optimiser temporaries)
sampling    2·L·R·S·n_kv·d_head·b_c (KV cache)              α samples in torch; with vLLM on a GPU all of it
            + ⌈P/N⌉·Lp·(4H + 3I)·b_c (one prefill layer)    lives in vLLM's share u·M of the card instead
            + (b_c + 20)·R·V (one decoding step's logits)
            + :data:`HEAP_RETENTION`·R·T·V (the C heap's)   CPU only (glibc keeps the sampler's freed blocks)
            or, α in vLLM's CPU engine: its weights and     K: the engine's KV cache as configured
            KV cache, W·b_c/b + K, and what it adds         (``Layout.vllm_cpu_kv_cache``); with TRL's
            itself, c_E·W + :data:`VLLM_CPU_ENGINE_FIXED`   server mode none of it is here
training    m·S·L·(10H + 4I)·b_c (activations)              the loop: one micro-batch's forward and backward
            + attention over L layers
            + 12·m·T·V (logits: float32 and their gradient,
            with the b_c ones or the log-softmax's chunks)
            m·S·L·H·b_c (each layer's input)                the TRL adapter: gradient checkpointing, and
            + m·S·(10H + 4I)·b_c (one layer recomputed)     TRL's fused LM head (tiles, its float32 weight
            + attention over one layer                      and input gradients), TRL's defaults
            + t·v·b_c (a logits tile, at most)
            + 4·V·H + m·T·H·(4 + b_c)
attention   2·n_head·m·S²·b_c a layer (scores and           CPU (the calibrated count)
            probabilities of each row)
            E·b_c a layer (the kernel's copy of the mask)   GPU: SDPA's memory-efficient kernel keeps no
            + the mask: E·b (the loop's, in the weights'    scores; E = n·W² entries of the loop's packed
            dtype) or E bytes (TRL's, boolean)              mask (:func:`packed_mask_entries`), m·S² of
                                                            TRL's
=========== =============================================== ===============================================

The plan on a device of M bytes a card, N processes (one a card)::

    budget    = BUDGET_FRACTION·(available − u·M)      (or TrainConfig.memory_budget_gib, with a warning)
    available = what the device has free (live), or M − CUDA_RESERVED − W/N_s (a recorded card)

The loop takes a smaller micro-batch when the plan's does not fit; the TRL route cannot (P·G must stay a multiple
of its micro-batch × N), so there the plan refuses and names the micro-batch that would fit.

B = P·G sequences (P prompts), R = ⌈B/N⌉ rows sampled per process, Lp the longest prompt,
T = ``max_completion_length``, S = Lp + T, m the micro-batch, W and W_t π_θ's weights and trainable weights in
bytes, b bytes per weight element, b_c per element the forwards compute in (b_c < b: mixed precision), c_W =
:data:`C_OVERHEAD_W`, N_s the processes that split weights, gradients and optimiser (ZeRO-3: N; DDP: 1), u vLLM's
``gpu_memory_utilization``, c_E = :data:`VLLM_CPU_ENGINE_W`, t·v TRL's LM-head tile (:data:`TRL_LOGPROB_TILE`);
L, H, I, V, n_head, n_kv, d_head from the model's config (:class:`ModelShape`). Why each term, the heap's
retention, the calibrations (:data:`CALIBRATION`, :data:`VLLM_CPU_CALIBRATION`) and what has not been measured on
a GPU: docs/internals.md#memory-guard.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..checks import require_choice, require_int_at_least, require_number_in
from ..config import GRPOConfig

if TYPE_CHECKING:
    from .train_config import TrainConfig

C_OVERHEAD_W = 2.45
"""What the measured peaks exceed the other parts by, at most, in units of W (see CALIBRATION). Fitted on a CPU;
a GPU plan uses it too until a GPU's peak has been measured against the plan."""
HEAP_RETENTION = 8
"""Bytes per B·V entry and decoded step that the C heap may keep from the sampler's per-step tensors: above
the most measured, 4.75 (docs/internals.md#memory-guard; docs/decisions.md, Memory). A CPU's only."""
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
VLLM_CPU_ENGINE_W = 1.25
"""What a vLLM CPU engine adds besides its weights in b_c and its KV cache, per byte of W: the checkpoint it reads
(its pages stay resident while mapped) and the load's temporaries (VLLM_CPU_CALIBRATION)."""
VLLM_CPU_ENGINE_FIXED = 480 * 2**20
"""Bytes a vLLM CPU engine adds whatever the model (its runner's buffers, the scheduler's and the sampler's state,
the modules it imports while built), with VLLM_CPU_ENGINE_W·W: above every measured engine (VLLM_CPU_CALIBRATION)."""
VLLM_CPU_CALIBRATION = (
    "vLLM 0.32's CPU build, eager, a bfloat16 engine over float32 Qwen2 weights with Qwen2.5's vocabulary, P = 2, "
    "G = 4, T = 8, 96 prompt tokens, the KV cache build_loop sizes: peak RSS of vllm_sampler (the engine, its KV "
    "cache, α's scorer copy, the first sync) and one step's sampling above the RSS before it, 3 fresh processes per "
    "model (benchmarks/vllm_cpu_engine_memory.py): W = 75, 295 and 739 MiB added 650, 1246 and 2432 MiB; less W "
    "(the scorer), W·b_c/b and K that leaves 536.4–536.7, 797.1–797.7 and 1298.3–1298.4 MiB, about "
    "450 MiB + 1.15·W (the checkpoint's mapped pages among it: 509 MiB of file pages resident after the step at "
    "W = 295 MiB). c_E = 1.25 and 480 MiB bound it: measured / estimated = 0.92–0.94")
CUDA_RESERVED = 2**30
"""Bytes of each card a recorded plan leaves outside torch's allocator: the CUDA context (about 0.5 GiB for a torch
process on recent CUDA) and the cuBLAS and NCCL workspaces. An allowance, not measured here; a live plan reads
the card's free memory, which already excludes them."""
ZERO3_LIVE_PARAMETERS = 10**9
"""Elements of weights DeepSpeed ZeRO-3 keeps gathered at once at most (its ``stage3_max_live_parameters`` default,
which the accelerate configs leave)."""
TRL_LOGPROB_TILE = (4096, 32768)
"""t positions × v vocabulary entries: the logits tile of TRL 1.16's fused LM head (``TOKEN_CHUNK_SIZE`` in
``trl/kernels/chunked_logprob.py``, ``_CHUNKED_LOGPROB_CHUNK_SIZE`` in ``trl/trainer/utils.py``)."""
ROUTES = ("loop", "trl")
"""How a run trains: ``loop`` (:class:`~grpo_lab.loop.GRPOLoop` from :func:`~grpo_lab.lm.build.build_loop`, one
process) or ``trl`` (:mod:`grpo_lab.scale.trl`: gradient checkpointing and the fused LM head, TRL's defaults)."""


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs from a causal LM: bytes and its config's sizes."""

    weights: int          # W: parameters + buffers, each shared tensor once
    trainable: int        # W_t: parameters with requires_grad
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
    def of_checkpoint(cls, path: str, dtype: torch.dtype | str, compute_dtype: torch.dtype | None = None,
                      trust_remote_code: bool = False) -> ModelShape:
        """The shape of the causal LM at ``path`` (a directory or hub id) loaded in ``dtype`` (a name, or ``auto``:
        its config's), read from its config alone: the model is built on PyTorch's meta device, so no weight is
        read or allocated (a guard that runs before the load)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        dtype = config.dtype if dtype == "auto" else dtype
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code, dtype=dtype)
        return cls.of(model, compute_dtype)

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
class Device:
    """A device a run is planned on: ``count`` alike, one process each, with ``memory`` bytes apiece (M)."""

    name: str
    kind: str             # "cpu" (the sampler's C heap is budgeted) or "cuda"
    memory: int           # M: a card's total memory (nvidia-smi's memory.total), or the host's RAM
    count: int = 1        # N: devices, one training process each

    def __post_init__(self) -> None:
        require_choice("kind", self.kind, ("cpu", "cuda"))
        require_int_at_least("memory", self.memory, 1)
        require_int_at_least("count", self.count, 1)

    @classmethod
    def of(cls, device: torch.device | str) -> Device:
        """The device a live run's π_θ is on: a CUDA card, else the host (as :func:`available_memory` reads it)."""
        device = torch.device(device)
        if device.type == "cuda":
            return cls(str(device), "cuda", torch.cuda.get_device_properties(device).total_memory)
        import psutil

        return cls(str(device), "cpu", psutil.virtual_memory().total)


MIB = 2**20
DEVICES = {
    "16GB": Device("Tesla T4 (16 GB)", "cuda", 15360 * MIB),
    "24GB": Device("GeForce RTX 4090 (24 GB)", "cuda", 24564 * MIB),
    "80GB": Device("H100 80GB HBM3", "cuda", 81559 * MIB),
    "141GB": Device("H200 (141 GB)", "cuda", 143771 * MIB),
    "8x80GB": Device("8 × H100 80GB HBM3", "cuda", 81559 * MIB, count=8),
}
"""Recorded cards, by nvidia-smi's ``memory.total`` (MiB): plans for them need no GPU (:func:`plan_for`). Of the
80 GB cards the H100 has the least (an A100 80GB reports 81920 MiB)."""


@dataclass(frozen=True)
class Layout:
    """How a run uses its devices beyond the model and the config: what one process holds depends on it."""

    route: str = "loop"        # a name of ROUTES
    shards: int = 1            # N_s: processes splitting weights, gradients and optimiser (ZeRO-3: all N; DDP: 1)
    vllm_share: float = 0.0    # u: vLLM's gpu_memory_utilization on each card (0: no engine on the GPU)
    vllm_cpu_kv_cache: int = 0  # K: bytes of KV cache of α's vLLM engine on the CPU (0: no engine on the CPU)
    vllm_server: bool = False  # α in a vLLM server on other GPUs (TRL's server mode): nothing of it here

    def __post_init__(self) -> None:
        require_choice("route", self.route, ROUTES)
        require_int_at_least("shards", self.shards, 1)
        require_number_in("vllm_share", self.vllm_share, 0.0, 1.0)
        require_int_at_least("vllm_cpu_kv_cache", self.vllm_cpu_kv_cache, 0)
        engines = {name: value for name, value in (("vllm_share", self.vllm_share),
                                                   ("vllm_cpu_kv_cache", self.vllm_cpu_kv_cache),
                                                   ("vllm_server", self.vllm_server)) if value}
        if len(engines) > 1:
            raise ValueError(f"{engines}: α's engine is on this GPU, on this CPU or on a server, one of them")
        if self.vllm_server and self.route != "trl":
            raise ValueError(f"vllm_server = True on route {self.route!r}: only the TRL route samples from a server")

    @property
    def alpha_in_vllm(self) -> bool:
        """α samples in a vLLM engine (on this GPU or CPU, or on a server), not in torch."""
        return bool(self.vllm_share or self.vllm_cpu_kv_cache or self.vllm_server)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one process of a run adds to the loaded π_θ, by part (the table in the module docstring)."""

    sampler: int
    reference: int
    gradients: int
    optimizer: int
    autocast: int
    gathered: int
    overhead: int
    sampling: int
    training: int

    @property
    def new(self) -> int:
        """Peak bytes added on top of π_θ's weights."""
        return (self.sampler + self.reference + self.gradients + self.optimizer + self.autocast + self.gathered
                + self.overhead + self.sampling + self.training)

    def summary(self) -> str:
        """``new`` and each part that is not zero, in GiB."""
        parts = ", ".join(f"{name} {gib(getattr(self, name))}" for name in
                          ("sampler", "reference", "gradients", "optimizer", "autocast", "gathered", "overhead",
                           "sampling", "training") if getattr(self, name))
        return f"{gib(self.new)} ({parts})"


def estimate_memory(shape: ModelShape, config: GRPOConfig, prompt_length: int, micro_batch_size: int | None = None,
                    device: Device | None = None, layout: Layout = Layout()) -> MemoryEstimate:
    """The bytes one process of a run of ``config`` adds to the loaded model (see the module docstring).

    ``micro_batch_size`` overrides ``config.micro_batch_size`` (None: the config's, else all R rows);
    ``device`` None: one CPU process.
    """
    require_int_at_least("prompt_length", prompt_length, 1)
    if config.max_completion_length is None:
        raise ValueError("max_completion_length must be set to estimate an LLM run's memory, got None")
    kind, N = (device.kind, device.count) if device is not None else ("cpu", 1)
    N_s, u, K = layout.shards, layout.vllm_share, layout.vllm_cpu_kv_cache
    if layout.route == "loop" and N > 1:
        raise ValueError(f"the loop runs one process; {device.name} has {N} devices: plan route 'trl' on them")
    if N_s not in (1, N):
        raise ValueError(f"shards = {N_s}: each process holds whole weights (1) or a shard of all {N} (ZeRO-3)")
    if u > 0 and kind != "cuda":
        raise ValueError(f"vllm_share = {u}: vLLM's gpu_memory_utilization is a share of a GPU, and {kind} is none")
    if K > 0 and kind != "cpu":
        raise ValueError(f"vllm_cpu_kv_cache = {K}: an engine on {kind} takes vllm_share of the card instead")
    P, T, W, W_t = config.prompts_per_step, config.max_completion_length, shape.weights, shape.trainable
    b, b_c = shape.element_size, shape.compute_bytes
    R = math.ceil(P * config.G / N)
    m = min(micro_batch_size or config.micro_batch_size or R, R)
    if K > 0:
        sampling = W // b * b_c + K + math.ceil(VLLM_CPU_ENGINE_W * W) + VLLM_CPU_ENGINE_FIXED
    elif not layout.alpha_in_vllm:
        sampling = sampler_tensor_bytes(shape, R, math.ceil(P / N), prompt_length, T)
        sampling += HEAP_RETENTION * R * T * shape.vocab if kind == "cpu" else 0
    else:
        sampling = 0
    return MemoryEstimate(
        sampler=W if layout.route == "loop" or not layout.alpha_in_vllm else 0,
        reference=math.ceil(W / N_s) if config.beta > 0 else 0,
        gradients=math.ceil(W_t / N_s) * (2 if N > 1 and N_s == 1 else 1),
        optimizer=2 * math.ceil(W_t / N_s) if config.optimizer == "adamw" else 0,
        autocast=math.ceil(W_t // b * b_c / N_s) if b_c < b else 0,
        gathered=min(ZERO3_LIVE_PARAMETERS, W // b) * b_c if N_s > 1 else 0,
        overhead=math.ceil(C_OVERHEAD_W * W / N_s), sampling=sampling,
        training=training_bytes(shape, kind, layout.route, m, config.G, prompt_length, T))


def sampler_tensor_bytes(shape: ModelShape, B: int, P: int, prompt_length: int, T: int) -> int:
    """The tensors the sampler holds at once (the sampling row without the heap's retention): B = P·G rows
    decoded up to T tokens after prompts of ``prompt_length``, in the compute dtype."""
    b_c = shape.compute_bytes
    kv_cache = 2 * shape.layers * B * (prompt_length + T) * shape.kv_heads * shape.head_dim * b_c
    prefill_layer = P * prompt_length * (4 * shape.hidden + 3 * shape.intermediate) * b_c
    return kv_cache + prefill_layer + (b_c + 20) * B * shape.vocab


def training_bytes(shape: ModelShape, kind: str, route: str, m: int, G: int, prompt_length: int, T: int) -> int:
    """The training row of the module docstring: one micro-batch of m rows' forward and backward on ``route``."""
    L, H, I, V, b_c = shape.layers, shape.hidden, shape.intermediate, shape.vocab, shape.compute_bytes
    S = prompt_length + T
    layer = m * S * (10 * H + 4 * I) * b_c
    if kind == "cpu":
        mask, attention_layer = 0, 2 * shape.heads * m * S * S * b_c
    elif route == "loop":
        entries = packed_mask_entries(m, G, prompt_length, T)
        mask, attention_layer = entries * shape.element_size, entries * b_c
    else:
        mask, attention_layer = m * S * S, m * S * S * b_c
    if route == "loop":
        return L * (layer + attention_layer) + mask + 3 * 4 * m * T * V
    t, v = TRL_LOGPROB_TILE
    head = min(m * T, t) * min(V, v) * b_c + 4 * V * H + m * T * H * (4 + b_c)
    return L * m * S * H * b_c + layer + attention_layer + mask + head


def packed_mask_entries(m: int, G: int, prompt_length: int, T: int) -> int:
    """n·W², the entries of the ``[n, 1, W, W]`` attention mask :class:`~grpo_lab.lm.policy.LMPolicy` builds for
    the widest micro-batch of m consecutive rows (groups of G rows share a prompt), every completion T tokens
    long: its layout (:func:`~grpo_lab.lm.policy.packed_layout`) for each way m rows can fall across groups."""
    from .policy import PACKED_INPUTS, packed_layout

    rows = math.lcm(m, G)
    prompt_ids = torch.arange(rows).div(G, rounding_mode="floor")[:, None].expand(rows, prompt_length)
    used = torch.full((rows,), T - 1)                   # the inputs of a row that scores all T tokens
    widest = 0
    for start in range(0, rows, m):
        block = slice(start, start + m)
        first, _, _, width = packed_layout(prompt_ids[block], torch.ones_like(prompt_ids[block]), used[block],
                                           PACKED_INPUTS)
        widest = max(widest, len(first) * width * width)
    return widest


@dataclass(frozen=True)
class MemoryPlan:
    """What :func:`plan_for` decided: the micro-batch the run uses on this device, and why."""

    micro_batch_size: int        # m: rows per forward and backward
    estimate: MemoryEstimate     # the bytes one process adds at that m
    available: int               # bytes each device had free
    budget: int                  # bytes the plan let the run add: BUDGET_FRACTION·(available − u·M), or the override
    shrunk: bool                 # m is below what the config asked for


def plan_for(shape: ModelShape, config: TrainConfig, prompt_length: int, device: Device, layout: Layout = Layout(),
             available: int | None = None) -> MemoryPlan:
    """The micro-batch a run of ``config`` can use on ``device`` laid out as ``layout``: the config's (or all of a
    process's rows) if it fits in the budget, else the largest that fits (printed; on the TRL route a ValueError
    naming it), else ValueError naming the figure that does not fit. ``available``: bytes each device has free
    with π_θ loaded (None: a recorded device's, M − CUDA_RESERVED on a GPU − π_θ's weights W/N_s).
    ``config.memory_budget_gib`` replaces the budget (with a warning). The config is not changed: the loop takes
    the plan's micro-batch."""
    resident = math.ceil(shape.weights / layout.shards)
    if available is None:
        available = max(device.memory - (CUDA_RESERVED if device.kind == "cuda" else 0) - resident, 0)
        where = (f"of {device.name}'s {gib(device.memory)} a card after π_θ's weights ({gib(resident)})"
                 + (f" and CUDA's {gib(CUDA_RESERVED)}" if device.kind == "cuda" else ""))
    else:
        where = f"free on {device.name} with π_θ loaded"
        require_int_at_least("available", available, 0)
    vllm = math.ceil(layout.vllm_share * device.memory)
    if vllm:
        where += f", of which vLLM takes its {layout.vllm_share:.0%} share ({gib(vllm)})"
    budget = int(BUDGET_FRACTION * max(available - vllm, 0))
    if config.memory_budget_gib is not None:
        warnings.warn(f"memory guard: planning in memory_budget_gib = {config.memory_budget_gib} GiB, as the config "
                      f"asks, instead of its own {gib(budget)} ({gib(available)} {where}); a run that does not fit "
                      "will stop with out-of-memory", stacklevel=2)
        budget = int(config.memory_budget_gib * 2**30)
    rows = config.prompts_per_step * config.G
    if layout.route == "trl" and rows % device.count:
        raise ValueError(f"prompts_per_step·G = {rows} must be a multiple of the {device.count} processes on the TRL "
                         "route")
    R = math.ceil(rows / device.count)
    m = min(config.micro_batch_size or R, R)

    def at(k: int) -> MemoryEstimate:
        return estimate_memory(shape, config, prompt_length, k, device, layout)

    estimate = at(m)
    if estimate.new <= budget:
        return MemoryPlan(m, estimate, available, budget, shrunk=False)
    fits = next((k for k in range(m - 1, 0, -1) if at(k).new <= budget), None)
    if fits is None:
        raise ValueError(
            f"memory guard: the run needs about {at(1).summary()} on {device.name} beyond the loaded weights "
            f"even with micro_batch_size = 1, but only {gib(available)} is available ({where}; planning with "
            f"{BUDGET_FRACTION:.0%} of the rest: {gib(budget)}); lower prompts_per_step·G = "
            f"{config.prompts_per_step * config.G}, max_completion_length = {config.max_completion_length}, or use "
            "a smaller model or dtype")
    if layout.route == "trl":  # k = 1 divides: P·G is a multiple of the processes on this route
        whole = next(k for k in range(fits, 0, -1) if rows % (k * device.count) == 0)
        raise ValueError(
            f"memory guard: the run needs about {estimate.summary()} on {device.name} beyond the loaded weights with "
            f"micro_batch_size = {m}, but {gib(budget)} is there to plan in ({gib(available)} {where}); the TRL "
            f"route keeps the micro-batch it is given (P·G = {rows} is micro_batch_size × {device.count} processes "
            f"× the accumulation steps): micro_batch_size = {whole} fits (--set micro_batch_size={whole})")
    print(f"memory guard: micro_batch_size {config.micro_batch_size} → {fits}: the run would need about "
          f"{gib(estimate.new)} on {device.name} beyond the loaded weights with {m} sequences per forward, "
          f"{gib(budget)} is there to plan in ({gib(available)} {where})")
    return MemoryPlan(fits, at(fits), available, budget, shrunk=True)


def plan_memory(config: TrainConfig, model: torch.nn.Module, prompt_length: int, available: int | None = None,
                compute_dtype: torch.dtype | None = None, layout: Layout = Layout()) -> MemoryPlan:
    """:func:`plan_for` the loop on the device ``model`` is on, in ``available`` bytes (default: what
    :func:`available_memory` reads there). ``compute_dtype``: the dtype π_θ's forward computes in (None: its
    weights'); ``layout``: where α will sample (:func:`~grpo_lab.lm.build.sampler_layout`: in torch, or in a vLLM
    engine on the GPU or the CPU)."""
    location = next(model.parameters()).device
    available = available_memory(location) if available is None else available
    return plan_for(ModelShape.of(model, compute_dtype), config, prompt_length, Device.of(location), layout,
                    available)


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


