"""Atomic writes: a crash or SIGKILL mid-write never leaves a half-written file behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write through `write(file)` into a temp file in the same directory, fsync, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a run's files follow the user's umask
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it; put it back at once
    os.umask(mask)
    return mask


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: None if f.write(text.encode()) else None)


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
