"""An advisory lock per unit file, so that processes side by side (and sittings one after another) share one unit
order: each runs the next unit nobody holds, and a lock whose process died is released by the OS, not by hand."""

from __future__ import annotations

import fcntl
from pathlib import Path


class UnitLock:
    """An advisory lock on ``<unit>.lock``: held while a process runs the unit, released by the OS if it dies.
    ``with UnitLock(path) as held:``; ``held`` is False when another process holds it."""

    def __init__(self, path: Path) -> None:
        self.path = path.with_suffix(".lock")

    def __enter__(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = self.path.open("w")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.close()
            self.handle = None
            return False
        return True

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.path.unlink(missing_ok=True)
            self.handle.close()
