"""Atomic checkpoints of a :class:`~grpo_lab.loop.GRPOLoop`: write, then rename.

A checkpoint holds everything the loop needs to continue exactly (π_θ, α,
π_ref, optimiser, schedules, random state, history): see
``GRPOLoop.state_dict``. It is written by :func:`grpo_lab.files.atomic_write`: a
temporary file in the same folder, flushed to disk, then renamed over the target,
so a crash or a full disk mid-write leaves the previous checkpoint intact (the
next save removes a killed write's temporary file) and a failed write raises one
:class:`~grpo_lab.files.DiskError` naming the file, the step and the cause.
Loading uses ``torch.load(weights_only=True)``: tensors and plain Python values
only, never arbitrary pickled objects.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from ..files import atomic_write
from ..loop import GRPOLoop


def save_checkpoint(loop: GRPOLoop, path: str | Path) -> Path:
    """Write ``loop.state_dict()`` to ``path`` atomically and return the path (DiskError if it cannot)."""
    return atomic_write(path, lambda f: torch.save(loop.state_dict(), f), what=f"the checkpoint of step {loop.k}")


def load_checkpoint(loop: GRPOLoop, path: str | Path) -> GRPOLoop:
    """Restore ``loop`` from a checkpoint written by :func:`save_checkpoint`."""
    loop.load_state_dict(read_checkpoint(path))
    return loop


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The state a checkpoint written by :func:`save_checkpoint` holds (``GRPOLoop.state_dict``), read with
    ``weights_only`` loading; a missing, foreign, truncated or corrupt file raises an error naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint path {str(path)!r} does not exist or is not a file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # objects other than tensors and plain values, or not a torch file
        raise pickle.UnpicklingError(f"checkpoint {str(path)!r} refused by weights_only loading: {exc}") from exc
    except Exception as exc:  # a truncated or corrupt file: RuntimeError, OSError, EOFError, KeyError, … from torch
        if isinstance(exc, OSError) and exc.filename:  # the OS names the file itself (permissions, …)
            raise
        raise ValueError(f"checkpoint {str(path)!r} is truncated or corrupt ({type(exc).__name__}: {exc})") from exc
    if not isinstance(state, dict) or "k" not in state:
        raise ValueError(f"checkpoint {str(path)!r} is not a grpo_lab checkpoint (no step counter 'k')")
    return state
