"""Checkpoints: everything a resumed run needs to continue bit-for-bit (on CPU).

Saved to a temp file and renamed (see files.atomic_write); loaded with `weights_only=True`, so the
payload holds only tensors and plain Python containers (RNG states are converted accordingly).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mtl_bench.errors import ConfigError, ResumeError
from mtl_bench.files import atomic_write

CHECKPOINT_NAME = "last.pt"


def rng_state() -> dict[str, Any]:
    version, mt_state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(mt_state), gauss],
        "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    atomic_write(path, lambda f: torch.save(payload, f))


def find_checkpoint(resume: str | None, run_dir: Path) -> Path | None:
    """`trainer.resume`: null -> None; auto -> this run's checkpoint if there is one; else a file or run dir."""
    if resume is None:
        return None
    if resume == "auto":
        path = run_dir / "checkpoints" / CHECKPOINT_NAME
        return path if path.is_file() else None
    given = Path(resume).expanduser()
    for path in (given, given / "checkpoints" / CHECKPOINT_NAME, given / CHECKPOINT_NAME):
        if path.is_file():
            return path
    raise ConfigError(
        f"trainer.resume={resume!r}: no checkpoint there (allowed: null, auto, a checkpoint file or run dir)"
    )


CHECKPOINT_KEYS = ("step", "model", "optimizer", "scheduler", "balancer", "rng", "initial_test", "elapsed_s")


def load_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    """The checkpoint at `path`; a file that is not one (truncated, damaged, another program's) is one
    ConfigError line naming it. Nothing is written."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:  # UnpicklingError, RuntimeError, EOFError, OSError, IndexError, ...
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ResumeError(
            f"trainer.resume: {path} is not a readable mtl-bench checkpoint ({type(err).__name__}: "
            f"{reason[:200]}); resume from another checkpoint or start a new run"
        ) from None
    missing = [key for key in CHECKPOINT_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise ResumeError(
            f"trainer.resume: {path} is not an mtl-bench checkpoint (no {', '.join(missing)}); "
            "resume from another checkpoint or start a new run"
        )
    return state
