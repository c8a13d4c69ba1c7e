"""Proof that a sync took: fingerprints of the weights the sampler serves against π_θ's (docs/metrics.md).

After α ← π_θ, every tensor the sampler *serves* — the ones its forward reads, as they are laid out there —
must hold π_θ's weights as the sampler should hold them: cast to its dtype, fused as it fuses
(:data:`FUSIONS`), a tied LM head resolved. Each side fingerprints its own tensors and only the fingerprints
are compared: no weight crosses.

The fingerprint of a served tensor W at the sync of step k::

    samples = m blocks of W, drawn afresh at each sync, seeded by k and W's size (both sides draw alike)
    print   = CRC-32 of the samples' bytes in the sampler's dtype      (a tensor no larger: all of it)

========== ==========================================================================================
symbol     meaning
========== ==========================================================================================
block      :data:`BLOCK` consecutive elements of W's flat layout; or, where the engine serves W only
           through y = x·Wᵀ, :data:`COLUMNS` consecutive columns, read as y of one-hot x (:data:`KINDS`)
m          :data:`SAMPLES`, the element blocks a tensor (a matrix read by columns: one block)
d          independent draws a sync
q          the share of W's blocks that hold differing bytes
P(pass)    ≤ (1 − q)^d at one sync, ≤ (1 − q)^{dn} over n syncs, + 2⁻³² for a CRC collision
========== ==========================================================================================

π_θ's side picks the same samples from its own tensors (the fused parts' where the sampler fuses), casts them
and takes the same CRC. In process (:func:`prove_local`) the samples are compared byte for byte; only an
engine in another process sends CRCs. It cannot see a fused tensor whose parts were swapped *and* equal, nor
right weights served through a wrong layout: :mod:`grpo_lab.sync_audit` is the second line for those. Why
the bound holds and what it means for a stale tensor: docs/internals.md#fingerprint.
"""

from __future__ import annotations

import ctypes
import functools
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch

from .sync_audit import CHECKS, SyncError

SAMPLES = 16
"""m: the blocks of :data:`BLOCK` elements a fingerprint reads of a tensor at one sync."""

BLOCK = 16
"""Elements are read in blocks of this many consecutive ones (a 64-byte cache line of float32): after a sync has
streamed the weights through the caches, m random single elements would cost m cache misses per tensor; m
blocks cost the same misses and read 16× the bytes."""

COLUMNS = 4
"""The columns a fingerprint reads of a matrix the engine serves only through its product: one block of this many
consecutive columns, aligned (16 bytes of each float32 row of π_θ's matrix, inside one cache line), drawn afresh
at each sync. π_θ's side reads a column as one element of every row, so m single columns cost m cache misses a
row (a gather as slow as the engine's whole product) where one block costs one, and the engine's product costs
less with fewer one-hot inputs. The price: one draw a sync (d = 1) for a fault that spares whole columns
(docs/decisions.md has the costs)."""

KINDS = ("elements", "columns")
"""How a served tensor is sampled: elements of its flat layout (a plain tensor), or columns through the
engine's product."""

FUSIONS = ((r"qkv_proj", ("q_proj", "k_proj", "v_proj")), (r"gate_up_proj", ("gate_proj", "up_proj")))
"""Fused served names and their parts, concatenated along the output rows (vLLM's)."""

Served = dict[str, tuple[str, torch.dtype, int]]
"""Served name → (kind, the dtype it is served in, fingerprint), in the sampler's order."""


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 ``x`` (Steele et al. 2014): a fixed bijection whose outputs pass
    BigCrush for consecutive inputs, so the draws of one key are independent for every purpose here."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def block_starts(lengths: np.ndarray, step: int, block: int, count: int = SAMPLES) -> np.ndarray:
    """The first positions of the ``count`` blocks drawn along axes of ``lengths`` (each > count · ``block``) at
    the sync of ``step`` ``[len(lengths), count]``: the axis cut into ⌈length / block⌉ blocks, each drawn
    uniformly and independently, keyed by (step, length) so both sides draw the same without talking; the last
    block is shifted back to end at the axis's end. One vectorised draw for every tensor of a model."""
    keys = np.uint64(step) * np.uint64(1_000_003) + lengths.astype(np.uint64)
    words = _splitmix64(keys[:, None] * np.uint64(count) + np.arange(count, dtype=np.uint64))
    blocks = (words % ((lengths + block - 1) // block).astype(np.uint64)[:, None]).astype(np.int64)
    return np.minimum(blocks * block, (lengths - block)[:, None])


@functools.lru_cache(maxsize=64)
def sample_positions(length: int, step: int, device: str = "cpu", block: int = BLOCK) -> torch.Tensor:
    """The positions a fingerprint reads along an axis of ``length`` at the sync of ``step``: all of them if
    they fit in m blocks, else the m blocks of ``block`` consecutive positions :func:`block_starts` draws; on
    ``device``."""
    if length <= SAMPLES * block:
        return torch.arange(length, device=device)
    starts = torch.from_numpy(block_starts(np.array([length]), step, block)[0])
    return (starts[:, None] + torch.arange(block)).reshape(-1).to(device)


@functools.lru_cache(maxsize=64)
def column_block(width: int, step: int) -> slice:
    """The columns a fingerprint reads of a matrix ``width`` columns wide at the sync of ``step``: all of them if
    there are at most :data:`COLUMNS`, else the block of :data:`COLUMNS` consecutive ones :func:`block_starts`
    draws."""
    if width <= COLUMNS:
        return slice(0, width)
    start = int(block_starts(np.array([width]), step, COLUMNS, count=1)[0, 0])
    return slice(start, start + COLUMNS)


def pick(parts: Sequence[torch.Tensor], kind: str, dtype: torch.dtype, step: int) -> torch.Tensor:
    """The samples of ``parts`` concatenated along dim 0 (one part: a plain tensor) at the sync of ``step``, in
    ``dtype``: m blocks of elements of the flat layout ``[m · BLOCK]``, or the block of columns row by row
    ``[rows, COLUMNS]`` (the engine's product of :data:`COLUMNS` one-hot inputs, transposed)."""
    if kind == "columns":                    # a strided slice: one cache line of every row
        block = column_block(parts[0].shape[1], step)
        return torch.cat([p.detach()[:, block] for p in parts]).to(dtype)
    if len(parts) == 1:                                       # a plain tensor: one gather (the common case)
        positions = sample_positions(parts[0].numel(), step, str(parts[0].device), BLOCK)
        return torch.take(parts[0].detach(), positions).to(dtype)
    # the fused tensor's flat layout is its parts' flat layouts one after another (same row width)
    device = parts[0].device
    positions = sample_positions(sum(p.numel() for p in parts), step, str(device), BLOCK)
    picked, start = torch.empty(len(positions), dtype=parts[0].dtype, device=device), 0
    for part in parts:
        inside = (positions >= start) & (positions < start + part.numel())
        picked[inside] = torch.take(part.detach(), positions[inside] - start)
        start += part.numel()
    return picked.to(dtype)


def crc(tensor: torch.Tensor) -> int:
    """CRC-32 of a tensor's bytes (as laid out contiguously, in its dtype)."""
    return zlib.crc32(tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy())


NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool)
"""The dtypes numpy holds bit for bit: a CPU tensor in one of them is read through numpy on the fast path."""


@functools.lru_cache(maxsize=64)
def _elements_of(length: int, step: int) -> np.ndarray:
    """The elements of the m blocks :func:`block_starts` draws along one axis of ``length`` ``[m · BLOCK]``
    (cached: the per-tensor path asks for the same few lengths of a model at each sync)."""
    return (block_starts(np.array([length]), step, BLOCK)[0][:, None] + np.arange(BLOCK)).reshape(-1)


def fingerprint(parts: Sequence[torch.Tensor], kind: str, dtype: torch.dtype, step: int) -> int:
    """``crc(pick(parts, kind, dtype, step))``: the fingerprint of a served tensor, or of π_θ's parts as it
    should be served. A plain CPU tensor sampled by elements in its own dtype (the in-process samplers' every
    tensor), larger than m blocks, is read through numpy, its blocks straight from :func:`block_starts`: the
    same bytes at a fraction of torch's per-call cost, which is what a proof over a few hundred tensors spends
    its time on."""
    part = parts[0]
    n = part.numel()
    if (len(parts) == 1 and kind == "elements" and part.dtype == dtype and dtype in NUMPY_DTYPES
            and part.device.type == "cpu" and n > SAMPLES * BLOCK and part.is_contiguous()):
        return zlib.crc32(part.detach().numpy().reshape(-1)[_elements_of(n, step)])
    return crc(pick(parts, kind, dtype, step))


def served_elements(named: Iterable[tuple[str, torch.Tensor]], step: int) -> Served:
    """The fingerprints of plain tensors as a sampler serves them (elements; in their own dtype) at the sync of
    ``step``."""
    return {name: ("elements", tensor.dtype, fingerprint([tensor], "elements", tensor.dtype, step))
            for name, tensor in named}


def parts_of(name: str, sources: Mapping[str, torch.Tensor]) -> list[str]:
    """The names of π_θ's tensors a served ``name`` holds: itself, or the parts of a fused name
    (:data:`FUSIONS`). Raises naming it when π_θ has none of them."""
    if name in sources:
        return [name]
    for fused, pieces in FUSIONS:
        if re.search(rf"\b{fused}\b", name):
            names = [re.sub(rf"\b{fused}\b", piece, name) for piece in pieces]
            if all(n in sources for n in names):
                return names
    raise SyncError(f"the sampler serves {name!r}, which π_θ has no tensor for (nor the parts of a fusion "
                    f"{[f for f, _ in FUSIONS]}): the sampler's model is not π_θ's")


def prove(served: Served, sources: Mapping[str, torch.Tensor], step: int) -> None:
    """Raise :class:`SyncError` unless every tensor the sampler serves has the fingerprint of π_θ's as the
    sampler should hold it at the sync of ``step`` (``sources``: π_θ's tensors that the sampler should serve,
    by name, a tied one under each of its names; cast to the dtype each is served in), naming the first that
    differs, the step and both fingerprints; and unless every tensor of π_θ is served somewhere."""
    differing, held = _differences(served, sources, step)
    _raise_first(list(served), differing, step)
    _require_all_served(sources, held, step)


def prove_local(served: Sequence[tuple[str, torch.Tensor]], sources: Mapping[str, torch.Tensor],
                step: int) -> None:
    """:func:`prove` for a sampler in this process (``served``: the tensors its forward reads, by name): the
    same samples, compared byte for byte instead of by CRC (no collision to allow for; the CRC-32s are only
    shown). A tensor served under π_θ's name in π_θ's dtype, contiguous on the CPU — every tensor of an
    in-process copy — is sampled by one gather over raw addresses for all of them on each side
    (:func:`_gather_blocks`): touching each tensor's few sampled cache lines is the proof's whole cost; any
    other goes through :func:`prove`'s per-tensor path."""
    raw, other = [], []
    for name, tensor in served:
        held = sources.get(name)
        (raw if held is not None and _raw_readable(tensor, held) else other).append((name, tensor, held))
    differing, held_names = _differences(served_elements([(name, t) for name, t, _ in other], step), sources, step)
    for size in {t.element_size() for _, t, _ in raw}:
        group = [(name, t, h) for name, t, h in raw if t.element_size() == size]
        lengths = np.array([t.numel() for _, t, _ in group])
        starts = block_starts(lengths, step, BLOCK) * size
        served_bytes = _gather_blocks([t for _, t, _ in group], starts, BLOCK * size)
        held_bytes = _gather_blocks([h for _, _, h in group], starts, BLOCK * size)
        for i in np.flatnonzero((served_bytes != held_bytes).any(axis=(1, 2))):
            name, tensor, _ = group[i]
            differing[name] = ([name], "elements", tensor.dtype, zlib.crc32(served_bytes[i]),
                               zlib.crc32(held_bytes[i]))
    _raise_first([name for name, _ in served], differing, step)
    _require_all_served(sources, held_names | {name for name, _, _ in raw}, step)


def prove_pairs(served: Sequence[torch.Tensor | None], held: Sequence[torch.Tensor | None], step: int) -> bool:
    """Whether, for every i, the i-th of ``served`` holds the samples of the i-th of ``held`` at the sync of
    ``step`` (a None pairing with a None): :func:`prove_local`'s comparison, byte for byte, for two listings the
    caller knows name their i-th tensors alike, made without the names. True proves what ``prove_local`` would
    prove; False says only that this path did not (a difference; a None, dtype or size that differs; a tensor
    not contiguous on the CPU), and the caller hands the named listings to ``prove_local``, which proves them or
    names what differs. A tensor of at most m blocks is compared whole, as its fingerprint reads it whole; the
    larger ones by one gather of their drawn blocks on each side (:func:`_gather_blocks`)."""
    layouts = _layouts(served)
    if layouts != _layouts(held) or not all(layout is None or layout[2] for layout in layouts):
        return False
    large: dict[int, list[tuple[torch.Tensor, torch.Tensor, int]]] = {}
    for tensor, its, layout in zip(served, held, layouts, strict=True):
        if layout is None:
            continue
        size = layout[0].itemsize
        if layout[1] > SAMPLES * BLOCK * size:
            large.setdefault(size, []).append((tensor, its, layout[1] // size))
        elif not torch.equal(_bytes(tensor), _bytes(its)):
            return False
    for size, group in large.items():
        tensors, theirs, lengths = zip(*group, strict=True)
        starts = block_starts(np.array(lengths), step, BLOCK) * size
        if not np.array_equal(_gather_blocks(tensors, starts, BLOCK * size),
                              _gather_blocks(theirs, starts, BLOCK * size)):
            return False
    return True


def _layouts(tensors: Sequence[torch.Tensor | None]) -> list[tuple[torch.dtype, int, bool] | None]:
    """Each tensor's dtype, bytes and whether its raw bytes are its flat layout (contiguous, on the CPU), read in
    one pass; None for a None entry. Two listings whose layouts are equal can be compared pair by pair on raw
    bytes."""
    return [None if t is None else (t.dtype, t.nbytes, t.is_cpu and t.is_contiguous()) for t in tensors]


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor's bytes (a view)."""
    return tensor.detach().reshape(-1).view(torch.uint8)


def _differences(served: Served, sources: Mapping[str, torch.Tensor],
                 step: int) -> tuple[dict[str, tuple], set[str]]:
    """Each served tensor whose fingerprint differs from π_θ's, by name: (π_θ's parts, kind, dtype, served
    fingerprint, π_θ's); and the names of π_θ's tensors the sampler serves."""
    parts = {name: parts_of(name, sources) for name in served}
    prints: dict[tuple, int] = {}                  # a tied tensor served under two names is fingerprinted once
    differing = {}
    for name, (kind, dtype, served_print) in served.items():
        held = [sources[p] for p in parts[name]]
        key = (*map(id, held), kind, dtype)
        if key not in prints:
            prints[key] = fingerprint(held, kind, dtype, step)
        if prints[key] != served_print:
            differing[name] = (parts[name], kind, dtype, served_print, prints[key])
    return differing, {p for names in parts.values() for p in names}


def _raise_first(order: Sequence[str], differing: Mapping[str, tuple], step: int) -> None:
    """Raise for the first tensor of ``order`` (the served order) that differs."""
    for name in order:
        if name in differing:
            _raise_differs(name, *differing[name], step)


def _raw_readable(tensor: torch.Tensor, held: torch.Tensor) -> bool:
    """Whether a served tensor and π_θ's can be sampled from their raw bytes alike: same dtype and size,
    contiguous, on the CPU, larger than m blocks."""
    return (tensor.dtype == held.dtype and tensor.numel() == held.numel() > SAMPLES * BLOCK
            and tensor.device.type == held.device.type == "cpu" and tensor.is_contiguous() and held.is_contiguous())


def _gather_blocks(tensors: Sequence[torch.Tensor], starts: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` bytes at byte offsets ``starts`` ``[n, m]`` of each of ``tensors`` ``[n, m, width]``, read
    in one numpy gather over a byte view spanning their addresses, each block one item of ``width`` bytes (so the
    gather is one tight loop of block copies, many cache misses in flight). Only bytes inside the tensors are
    read (every start + width ≤ the tensor's bytes), and the tensors are held by the caller while it runs."""
    addresses = np.array([t.data_ptr() for t in tensors], dtype=np.int64)
    ends = addresses + np.array([t.nbytes for t in tensors], dtype=np.int64)
    base, span = int(addresses.min()), int(ends.max() - addresses.min())
    memory = np.ctypeslib.as_array((ctypes.c_uint8 * span).from_address(base))
    blocks = np.ndarray((span - width + 1,), dtype=np.dtype((np.void, width)), buffer=memory, strides=(1,))
    return blocks[(addresses - base)[:, None] + starts].view(np.uint8).reshape(len(tensors), -1, width)


def _raise_differs(name: str, parts: Sequence[str], kind: str, dtype: torch.dtype, served_print: int,
                   print_: int, step: int) -> None:
    fused = f"fused from {list(parts)}, " if len(parts) > 1 else ""
    samples = "blocks of elements" if kind == "elements" else "block of columns"
    raise SyncError(
        f"the sync at step {step} did not take: {name!r} differs — the sampler serves fingerprint "
        f"{served_print:08x}, π_θ's ({fused}cast to {dtype}) is {print_:08x} (CRC-32 of the "
        f"{samples} drawn for this sync; grpo_lab.fingerprint). Check " + "; ".join(CHECKS)
        + ". (sync_audit=False turns this off.)")


def _require_all_served(sources: Mapping[str, torch.Tensor], served_parts: set[str], step: int) -> None:
    missing = sorted(set(sources) - served_parts)
    if missing:
        raise SyncError(f"the sync at step {step} cannot be proved: π_θ's {missing[:4]} are served by no tensor "
                        "of the sampler (a weight it does not load, or a layout grpo_lab.fingerprint does not "
                        "know)")
