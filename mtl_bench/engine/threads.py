"""How many intra-op threads a run gives torch: chosen for the work, not for the machine.

torch starts one intra-op thread per core. A model of the size this project trains (tens of thousands of
parameters) runs each op in microseconds, so a second thread buys little on one run on a quiet machine and
costs a lot as soon as anything else runs on the box: each op's threads wait for each other's cores (measured:
two copies of gradnorm_toy at once took 137 s each with torch's default, 52 s each with one thread).
`trainer.num_threads=auto` therefore gives a small model one thread, and a larger one the cores this process
may use divided by the number of runs its launcher starts at once.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from mtl_bench.settings import Setting, check_setting

# Below this many parameters a model's step gets one thread (scripts/bench_threads.py --sizes; docs/benchmarks.md,
# "Threads"). On a quiet 2-core machine a second thread changed the step of the MLPs up to 156k parameters by
# -13%..+11% (noise: median and best blocks disagree in sign) and sped up every larger one by 17-37%; on the
# same machine busy (load 4-12), a second thread made every size up to 8.4M 3-20x slower. LeNet on digits (9k
# parameters, but convolutions: more arithmetic per parameter) gains 7-15% from a second thread when quiet.
SMALL_MODEL_NUMEL = 200_000


def available_cores() -> int:
    """Cores this process may run on: its CPU affinity (what taskset, cgroups' cpusets and SLURM allot)
    where the OS reports one, else every core of the machine."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        try:
            return max(1, len(getaffinity(0)))
        except OSError:
            pass
    return max(1, os.cpu_count() or 1)


def _launcher_kind(launcher_cfg: Any) -> str:
    target = str(_get(launcher_cfg, "_target_") or "")
    if "joblib" in target.lower():
        return "joblib"
    if "submitit" in target.lower():
        return "submitit"
    return "basic"


def _get(cfg: Any, key: str) -> Any:
    if cfg is None:
        return None
    getter = getattr(cfg, "get", None)
    return getter(key) if getter is not None else getattr(cfg, key, None)


def parallel_runs_of(launcher_cfg: Any) -> int:
    """How many runs Hydra's launcher (`hydra.launcher`, from HydraConfig) starts at once on one machine.

    joblib: `n_jobs` (-1 is every core, -2 all but one, ...; joblib's own rule; a sweep of fewer jobs than
    that runs fewer, which the launcher's config does not say). The submitit launchers give
    each job its own `cpus_per_task` cores (see `cores_of`), so within those cores a job runs alone: 1. The
    basic launcher runs one job at a time: 1.
    """
    if _launcher_kind(launcher_cfg) != "joblib":
        return 1
    n_jobs = _get(launcher_cfg, "n_jobs")
    n_jobs = -1 if n_jobs is None else int(n_jobs)
    if n_jobs < 0:
        return max(1, available_cores() + 1 + n_jobs)
    return max(1, n_jobs)


def cores_of(launcher_cfg: Any) -> Optional[int]:
    """Cores one job of this launcher may use, or None where the launcher allots none (the process's
    affinity then says). submitit: `cpus_per_task` (on SLURM the affinity says the same: SLURM pins the job
    to its cores; submitit_local pins nothing, so the setting is what keeps its jobs apart)."""
    if _launcher_kind(launcher_cfg) == "submitit":
        cpus = _get(launcher_cfg, "cpus_per_task")
        return int(cpus) if cpus else None
    return None


def _local_processes() -> int:
    """Processes of one run on this machine: torchrun's LOCAL_WORLD_SIZE (each rank is a process), else 1."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _threads(n: int) -> str:
    return f"{n} intra-op thread{'' if n == 1 else 's'}"


def choose_threads(
    setting: Setting, *, model_numel: int, parallel_runs: int = 1, cores: Optional[int] = None
) -> tuple[int, str]:
    """The intra-op thread count for a run, and one line saying why (log it once).

    setting: an int (or its string) wins; None keeps torch's default (torch.get_num_threads()); "auto": 1 for
    a model below SMALL_MODEL_NUMEL parameters, else the cores this process may use (`cores`, capped by
    its affinity; the affinity when None) divided among the `parallel_runs` runs started at once and the
    ranks of a torchrun job on this machine (LOCAL_WORLD_SIZE), at least 1.
    """
    setting = check_setting(setting)
    if setting is None:
        import torch

        n = torch.get_num_threads()
        return n, f"{_threads(n)} (torch's default; trainer.num_threads=auto chooses for the work)"
    if isinstance(setting, int):
        return setting, f"{_threads(setting)} (trainer.num_threads={setting})"
    allowed = available_cores()
    usable = allowed if cores is None else max(1, min(int(cores), allowed))
    if model_numel < SMALL_MODEL_NUMEL:
        return 1, (
            f"1 intra-op thread (trainer.num_threads=auto: the model's {model_numel:,} parameters are below "
            f"{SMALL_MODEL_NUMEL:,}; a second thread gains little on a quiet machine and costs a lot on a busy one)"
        )
    runs = max(1, int(parallel_runs)) * _local_processes()
    n = max(1, usable // runs)
    shared = f" shared by {runs} processes at once" if runs > 1 else ""
    return n, (
        f"{_threads(n)} (trainer.num_threads=auto: {usable} cores this process may use{shared}; "
        f"{model_numel:,} parameters)"
    )
