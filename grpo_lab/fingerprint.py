"""Proof that a sync took: fingerprints of the weights the sampler serves against π_θ's (docs/metrics.md).

After α ← π_θ, every tensor the sampler *serves* — the ones its forward reads, as they are laid out there —
must hold π_θ's weights as the sampler should hold them: cast to the sampler's dtype, fused as it fuses
(vLLM's ``qkv_proj`` = [q; k; v] and ``gate_up_proj`` = [gate; up] along the output
rows), with a tied LM head resolved (the served head must equal π_θ's embedding). Each side fingerprints its
own tensors, and only the fingerprints are compared: no weight crosses.

The fingerprint of a served tensor W (its served name, a *line* axis, a dtype)::

    lines    = m fixed random lines of W (rows; or columns, where the engine serves W only through its
               product y = x·Wᵀ: then read as y of m one-hot x, which is exact, each output one weight)
    print    = CRC-32 of the lines' bytes in the sampler's dtype           (1-D tensors: every element)

π_θ's side picks the same lines from its own tensors (the fused parts' lines where the sampler fuses), casts
them to the sampler's dtype, and takes the same CRC. The lines are drawn once per line count (seeded by it),
so both sides agree without talking. False pass: a served tensor whose differing bytes lie in a fraction q
of its lines matches with probability ≤ (1 − q)^m (the m lines all miss them), plus 2⁻³² (a CRC collision);
one optimiser step changes (nearly) every line in float32, so a stale tensor is caught with certainty.
Lines are whole rows where the sampler's tensor is a plain one, so a proof reads m/rows of the bytes.

What it cannot see: a fused tensor whose parts were loaded in the wrong order *and* equal (never in
practice), or weights that are right but served through a wrong layout (a kernel reading a packed matrix
the wrong way); the behavioural probe (:mod:`grpo_lab.sync_audit`) stays as a second line for those.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence

import torch

from .sync_audit import CHECKS, SyncError

LINES = 16
"""m: the lines (rows or columns) of each 2-D tensor a fingerprint reads."""

KINDS = ("rows", "columns")
"""How a served tensor's lines are read: its rows (a plain tensor), or its columns through the engine's product."""

FUSIONS = ((r"qkv_proj", ("q_proj", "k_proj", "v_proj")), (r"gate_up_proj", ("gate_proj", "up_proj")))
"""Fused served names and their parts, concatenated along the output rows (vLLM's)."""

Served = dict[str, tuple[str, torch.dtype, int]]
"""Served name → (kind, the dtype it is served in, fingerprint), in the sampler's order."""


@functools.lru_cache(maxsize=256)
def line_indices(length: int, lines: int = LINES) -> torch.Tensor:
    """The fixed lines of an axis of ``length``: all of them if ≤ ``lines``, else ``lines`` drawn without
    replacement by a generator seeded with ``length``, sorted."""
    if length <= lines:
        return torch.arange(length)
    return torch.randperm(length, generator=torch.Generator().manual_seed(length))[:lines].sort().values


def crc(tensor: torch.Tensor) -> int:
    """CRC-32 of a tensor's bytes (as laid out contiguously, in its dtype)."""
    return zlib.crc32(tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy())


def pick(parts: Sequence[torch.Tensor], kind: str, dtype: torch.dtype) -> torch.Tensor:
    """The fingerprinted lines of ``parts`` concatenated along dim 0 (one part: a plain tensor), in ``dtype``:
    every element of a tensor of < 2 dims; m rows ``[m, …]``; or m columns, laid out as the engine's product
    of m one-hot inputs returns them, ``[m, rows]``."""
    if parts[0].dim() < 2:
        return torch.cat([p.detach().reshape(-1) for p in parts]).to(dtype)
    if kind == "columns":
        columns = line_indices(parts[0].shape[1])
        return torch.cat([p.detach()[:, columns] for p in parts]).to(dtype).t()
    if len(parts) == 1:                                       # a plain tensor: one gather (the common case)
        return parts[0].detach()[line_indices(parts[0].shape[0])].to(dtype)
    rows, start, picked = line_indices(sum(p.shape[0] for p in parts)), 0, []
    for part in parts:
        inside = rows[(rows >= start) & (rows < start + part.shape[0])] - start
        picked.append(part.detach()[inside])
        start += part.shape[0]
    return torch.cat(picked).to(dtype)


def served_rows(named: Iterable[tuple[str, torch.Tensor]]) -> Served:
    """The fingerprints of plain tensors as a sampler serves them (rows; in their own dtype)."""
    return {name: ("rows", tensor.dtype, crc(pick([tensor], "rows", tensor.dtype))) for name, tensor in named}


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
    sampler should hold it (``sources``: π_θ's tensors that the sampler should serve, by name, a tied one under
    each of its names; cast to the dtype each is served in), naming the first that differs, the step and both
    fingerprints; and unless every tensor of π_θ is served somewhere."""
    covered: set[str] = set()
    for name, (kind, dtype, served_print) in served.items():
        parts = parts_of(name, sources)
        covered.update(parts)
        expected = crc(pick([sources[p] for p in parts], kind, dtype))
        if expected != served_print:
            held = f"fused from {parts}, " if len(parts) > 1 else ""
            raise SyncError(
                f"the sync at step {step} did not take: {name!r} differs — the sampler serves fingerprint "
                f"{served_print:08x}, π_θ's ({held}cast to {dtype}) is {expected:08x} (CRC-32 of {LINES} "
                f"fixed {kind}; grpo_lab.fingerprint). Check " + "; ".join(CHECKS)
                + ". (sync_audit=False turns this off.)")
    missing = sorted(set(sources) - covered)
    if missing:
        raise SyncError(f"the sync at step {step} cannot be proved: π_θ's {missing[:4]} are served by no tensor "
                        "of the sampler (a weight it does not load, or a layout grpo_lab.fingerprint does not "
                        "know)")
