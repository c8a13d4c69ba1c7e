"""Atomic checkpoints of a :class:`~grpo_lab.loop.GRPOLoop`: write, then rename.

A checkpoint holds everything the loop needs to continue exactly (π_θ, α,
π_ref, optimiser, schedules, random state, history): see
``GRPOLoop.state_dict``. It is written to a temporary file in the same folder,
flushed to disk, then renamed over the target, so a crash mid-write leaves the
previous checkpoint intact (the next save removes the crashed write's temporary
file). Loading uses ``torch.load(weights_only=True)``: tensors and plain Python
values only, never arbitrary pickled objects.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import torch

from ..loop import GRPOLoop


def save_checkpoint(loop: GRPOLoop, path: str | Path) -> Path:
    """Write ``loop.state_dict()`` to ``path`` atomically and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a writer killed mid-write (SIGKILL, power loss)
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(loop.state_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(loop: GRPOLoop, path: str | Path) -> GRPOLoop:
    """Restore ``loop`` from a checkpoint written by :func:`save_checkpoint`."""
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
    loop.load_state_dict(state)
    return loop
