"""Checkpoints: everything a resumed run needs to continue bit-for-bit (on CPU).

Saved to a temp file and renamed (see files.atomic_write); loaded with `weights_only=True`, so the
payload holds only tensors and plain Python containers (RNG states are converted accordingly).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from mtl_bench.config import keys_where, option_defaults
from mtl_bench.errors import ConfigError, ResumeError
from mtl_bench.files import atomic_write
from mtl_bench.loggers.hparams import flatten_hparams
from mtl_bench.records import METRICS_FILE, Status, previous_status, record_failure

if TYPE_CHECKING:
    from mtl_bench.engine.recipe import Recipe

log = logging.getLogger("mtl_bench")

CHECKPOINT_NAME = "last.pt"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


# What may change when a run resumes (config.py: the options declared resumable); any other difference would
# train another config than the run records.
RESUMABLE_KEYS = keys_where("resumable")
# A checkpoint's own entries (RunState.save); each callback's state goes under its state_key beside them.
RUN_STATE_KEYS = (*CHECKPOINT_KEYS, "grad_scaler", "skipped_steps", "config", "overrides")
# The .hydra/ files an attempt's record holds (train.py sends a resume in place to .hydra/attempts/<n>/)
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")


class RunState:
    """What a run saves, restores and compares on resume, and the one record of whether this attempt wrote a
    checkpoint: a run directory that holds a run's record (metrics.json, the checkpoint) keeps it, its `.hydra/`
    and its log unless this attempt writes checkpoints/last.pt (`saved_here`)."""

    def __init__(self, run_dir: Path, cfg: DictConfig, overrides: list[str]) -> None:
        self.cfg, self.overrides = cfg, overrides
        self.run_dir = run_dir
        self.had_record = (run_dir / METRICS_FILE).is_file() or self.path.is_file()
        self.saved_here = False  # this attempt wrote checkpoints/last.pt
        self.saved_step: int | None = None  # the step of checkpoints/last.pt, once this run wrote or read one
        self.elapsed_before = 0.0  # wall time of earlier sessions of a resumed run

    @property
    def path(self) -> Path:
        return self.run_dir / "checkpoints" / CHECKPOINT_NAME

    def resume_setting(self, resume: str | None) -> str | None:
        """trainer.resume; a job that submitit requeued after preemption resumes its own run by itself."""
        if resume is None and os.environ.get("SUBMITIT_EXECUTOR"):
            if previous_status(self.run_dir) is Status.INTERRUPTED:
                return "auto"
        return resume

    def save(self, run: Recipe, elapsed: float) -> None:
        """checkpoints/last.pt (rank 0): the parts' states, the RNGs, the callbacks' states and the config."""
        if not run.is_main:
            return
        save_checkpoint(
            self.path,
            {
                "step": run.step,
                "model": run.model.state_dict(),
                "optimizer": run.optimizer.state_dict(),
                "scheduler": run.scheduler.state_dict(),
                "balancer": run.balancer.state_dict(),
                "grad_scaler": run.precision.scaler.state_dict() if run.precision.scaler is not None else None,
                **run.nonfinite.state_dict(),
                "rng": rng_state(),
                "initial_test": run.initial_test,
                **run.callbacks.state_dict(),  # select=<option>'s under "selection"
                "elapsed_s": elapsed,
                "config": OmegaConf.to_yaml(self.cfg, resolve=True),  # what was trained (checked on resume)
                "overrides": self.overrides,
            },
        )
        self.saved_step = run.step
        self.saved_here = True

    def check_same_config(self, state: dict[str, Any], source: Path) -> None:
        """Resume is the same run or nothing: any difference outside RESUMABLE_KEYS stops with one line (the run's
        record is left as it was: this attempt's goes apart)."""
        if "config" not in state:
            return
        saved = flatten_hparams(OmegaConf.to_container(OmegaConf.create(state["config"])))  # type: ignore[arg-type]
        now = flatten_hparams(OmegaConf.to_container(self.cfg, resolve=True))  # type: ignore[arg-type]
        defaults = option_defaults()
        differ = [
            key
            for key in sorted(set(saved) | set(now))
            if saved.get(key, "(unset)") != now.get(key, "(unset)")
            and not any(key == k or key.startswith(k + ".") for k in RESUMABLE_KEYS)  # logger.* too
            # an option added since the checkpoint was written, at its default: what the earlier version did
            and not (
                key not in saved and key in defaults and now.get(key) == flatten_hparams({key: defaults[key]})[key]
            )
        ]
        if not differ:
            return
        changes = ", ".join(f"{k} {saved.get(k, '(unset)')} -> {now.get(k, '(unset)')}" for k in differ[:6])
        more = f" and {len(differ) - 6} more" if len(differ) > 6 else ""
        raise ResumeError(
            f"trainer.resume: {source} was trained with another config ({changes}{more}); only "
            f"{', '.join(k.split('.')[-1] for k in RESUMABLE_KEYS)} may change on resume. To train "
            "this config, start a new run (without trainer.resume, or in a new hydra.run.dir)"
        )

    def restore(self, run: Recipe, state: dict[str, Any], source: Path) -> None:
        self.check_same_config(state, source)
        try:
            run.model.load_state_dict(state["model"])
            run.optimizer.load_state_dict(state["optimizer"])
            run.balancer.load_state_dict(state["balancer"])
        except (RuntimeError, ValueError, KeyError) as err:
            first_line = str(err).strip().splitlines()[0]
            raise ResumeError(f"trainer.resume: checkpoint {source} does not fit this config ({first_line})") from None
        run.scheduler.load_state_dict(state["scheduler"])
        if run.precision.scaler is not None and state.get("grad_scaler"):
            run.precision.scaler.load_state_dict(state["grad_scaler"])
        run.nonfinite.load_state_dict(state)
        set_rng_state(state["rng"])
        run.step = state["step"]
        run.initial_test = state["initial_test"]
        run.callbacks.load_state_dict(state)
        self.elapsed_before = state["elapsed_s"]
        self.saved_step = run.step
        log.info("resumed from %s at step %d", source, run.step)

    def record_failure(
        self, err: BaseException, step: int, choices: dict[str, str], attempt_dir: Optional[Path]
    ) -> None:
        """metrics.json's `"status": "failed"`: in the run directory, unless it holds a run's record that this
        attempt did not replace (then in `attempt_dir`, if given; a refused resume's always goes there)."""
        kept = self.had_record and not self.saved_here  # the run's record is the last good attempt's
        where = attempt_dir if kept or isinstance(err, ResumeError) else self.run_dir
        if where is not None:
            record_failure(where, err, step, self.overrides, choices)

    def promote(self, attempt_dir: Optional[Path]) -> None:
        """Once this attempt wrote the run's checkpoint, its .hydra/ record (config, overrides, Hydra's) becomes
        the run's and its log lines join the run's log; an attempt that wrote none leaves the run's as they were."""
        if attempt_dir is None or not self.saved_here:
            return
        for handler in logging.getLogger().handlers:
            handler.flush()
        for name in HYDRA_FILES:
            if (attempt_dir / name).is_file():
                shutil.copyfile(attempt_dir / name, self.run_dir / ".hydra" / name)
        log_file = attempt_dir / "train.log"
        if log_file.is_file():
            with open(self.run_dir / "train.log", "a") as run_log:
                run_log.write(log_file.read_text())
