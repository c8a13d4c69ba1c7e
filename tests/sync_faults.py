"""The sync faults users have met (issue 36 §3), as one push list each: the (name, tensor) pairs a faulty sync
hands the sampler instead of π_θ's. ``tests/test_sync_proof.py`` runs them on HFSampler and the TRL route,
``tests/test_vllm_engine.py`` on the real vLLM engine, ``tests/reliability_report.py`` counts them.

A tied LM head left behind is not a push list: the sampler's head stops sharing the embedding (vLLM's reload
alone does this where the head's GEMM packs its own copy, :func:`grpo_lab.lm.sampling_vllm.load_weights_into_vllm`),
so each sampler sets it up its way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

NORM, LARGE = "model.norm.weight", "model.layers.1.mlp.down_proj.weight"
SWAPPED = ("model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight")

FAULTS = {
    "does nothing": r"'[\w.]+' differs",
    "skips a norm's weight": re.escape(f"'{NORM}' differs"),
    "skips a large tensor": re.escape(f"'{LARGE}' differs"),
    "swaps two layers' down_proj": re.escape(f"'{SWAPPED[0]}' differs"),
    "leaves a tied LM head behind": r"'lm_head\.weight' differs",
}
"""Each fault and what its SyncError must match: the tensor it names."""


def pushed(named: Iterable[tuple[str, torch.Tensor]], fault: str) -> list[tuple[str, torch.Tensor]]:
    """What a sync with ``fault`` pushes of π_θ's ``named`` tensors (every tensor for the tied head's fault,
    which is set up on the sampler's side)."""
    named = list(named)
    if fault == "does nothing":
        return []
    if fault == "skips a norm's weight":
        return [(n, t) for n, t in named if n != NORM]
    if fault == "skips a large tensor":
        return [(n, t) for n, t in named if n != LARGE]
    if fault == "swaps two layers' down_proj":
        swap = {SWAPPED[0]: SWAPPED[1], SWAPPED[1]: SWAPPED[0]}
        return [(swap.get(n, n), t) for n, t in named]
    if fault == "leaves a tied LM head behind":
        return named
    raise ValueError(f"fault = {fault!r} is not one of {list(FAULTS)}")


def nudge(model: torch.nn.Module, scale: float = 0.01, seed: int = 1) -> None:
    """Move every parameter by seeded noise relative to its mean size (π_θ ≠ α until the next sync), on its device."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * p.abs().mean() * torch.randn(p.shape, generator=g).to(p))
