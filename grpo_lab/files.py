"""Files written during long work, safely: atomic replacement, whole lines, one clear error.

Every file the kit writes while it trains or measures (checkpoints, ``metrics.jsonl``, the study's
results, the experiments' JSON) goes through :func:`atomic_write` or :func:`append_line`. A full
disk, a quota or a read-only directory then leaves the previous contents intact (no half-written
file, no half-written line, no temporary file) and stops with one :class:`DiskError` whose
one-line message names the file, the cause and what to change. :func:`results_path` finds the committed
results of a checkout, or says what is missing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

CAUSES = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
          errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
          errno.EPERM: "operation not permitted"}
"""The causes named in plain words (others: the system's own text)."""
FULL = (errno.ENOSPC, errno.EDQUOT)
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


class DiskError(OSError):
    """A file does not fit or cannot be written. The message is one line (file, cause, what to
    change), fit to print without a traceback; ``errno`` is the cause's (ENOSPC, EROFS, …) or None."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.errno = code


def atomic_write(path: str | Path, data: bytes | str | Callable[[BinaryIO], None], what: str = "") -> Path:
    """Replace ``path`` with ``data`` (bytes, text as UTF-8, or a function writing to a binary file).

    Writes a temporary file in the same folder, fsyncs it and renames it over ``path``; a failure
    or a crash part-way leaves the previous ``path`` intact (the next write removes the temporary
    file a killed writer left). An OSError, including one that ``torch.save`` wraps in a
    RuntimeError, becomes a :class:`DiskError` naming ``what`` (e.g. "the checkpoint of step 4").
    """
    path = Path(path)
    write = data if callable(data) else (lambda f: f.write(data.encode() if isinstance(data, str) else data))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in temp_files(path):  # left by a writer killed mid-write (SIGKILL, power loss)
            stale.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise disk_error(path, exc, what) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            Path(tmp).unlink(missing_ok=True)
        cause = _os_error(exc)
        if cause is None:  # not the file system's doing (an interrupt, a bug in ``data``)
            raise
        raise disk_error(path, cause, what) from exc
    return path


def append_line(path: str | Path, line: str, what: str = "") -> None:
    """Append ``line`` and a newline to ``path`` whole: a write that fails part-way is cut back off."""
    path, data = Path(path), memoryview((line + "\n").encode())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise disk_error(path, exc, what) from exc
    try:
        size = os.fstat(fd).st_size
        try:
            while data:
                data = data[os.write(fd, data):]
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            if isinstance(exc, OSError):
                raise disk_error(path, exc, what) from exc
            raise
    finally:
        os.close(fd)


def temp_files(path: Path) -> Iterator[Path]:
    """The temporary files :func:`atomic_write` makes for ``path`` (one is left only by a killed writer)."""
    return path.parent.glob(f".{path.name}.*.tmp")


def free_bytes(path: str | Path) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing ancestor)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def size_text(n: int) -> str:
    """Bytes exactly and in MiB: ``'734003200 bytes (700.0 MiB)'``."""
    return f"{n} bytes ({n / 2**20:.1f} MiB)"


def disk_error(path: Path, exc: OSError, what: str = "") -> DiskError:
    """The one-line :class:`DiskError` for ``exc``, raised while writing ``path`` (returned as is if it is one)."""
    if isinstance(exc, DiskError):
        return exc
    cause = CAUSES.get(exc.errno) or exc.strerror or str(exc) or type(exc).__name__
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):  # a file stands where a folder is needed
        cause = f"{str(exc.filename or path)!r} is a file, not a folder"
    if exc.errno in FULL:
        with contextlib.suppress(OSError):
            cause += f", {size_text(free_bytes(path))} free"
        advice = "free some space or write elsewhere (another output_dir)"
    elif exc.errno in READ_ONLY:
        advice = "make the folder writable or write elsewhere (another output_dir)"
    else:
        advice = "check the folder, or write elsewhere (another output_dir)"
    kept = ""
    with contextlib.suppress(OSError):
        kept = f"; {path.name} keeps its previous contents" if path.is_file() and exc.errno != errno.EEXIST else ""
    return DiskError(f"could not write {what + ' to ' if what else ''}{str(path)!r}: {cause}{kept}; {advice}",
                     exc.errno)


def _os_error(exc: BaseException | None) -> OSError | None:
    """The OSError behind ``exc``: itself, or one in its chain of causes (torch turns a failed write into a
    RuntimeError "unexpected pos …" whose context is the OSError)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def results_path(*parts: str, root: str | Path | None = None) -> Path:
    """``<root>/results/<parts…>``: the committed measurements (the lag frontier, the task scan, the off-policy
    split, time to accuracy). They come with a checkout of the repository, not with the installed package, so
    ``root`` defaults to the folder above the package, a checkout in an editable install (``git clone``, then
    ``pip install -e .``). A root without ``results/`` is a FileNotFoundError that names the folder."""
    base = Path(__file__).resolve().parents[1] if root is None else Path(root)
    results = base / "results"
    if not results.is_dir():
        raise FileNotFoundError(f"{results} does not exist: the committed results/ come with a checkout of the "
                                "repository (git clone, then pip install -e .), not with the installed package; "
                                "pass root=<that checkout>")
    return results.joinpath(*parts)
