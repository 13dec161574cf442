"""How many intra-op threads a run gives torch: chosen for the work, not for the machine.

torch starts one intra-op thread per core. A model of the size this project trains (tens of thousands of
parameters) runs each op in microseconds, so a second thread buys little on one run on a quiet machine and
costs a lot as soon as anything else runs on the box: each op's threads wait for each other's cores (measured:
two copies of gradnorm_toy at once took 137 s each with torch's default, 52 s each with one thread).
`trainer.num_threads=auto` therefore gives a small model one thread, and a larger one the cores this process
may use divided by the number of runs its launcher starts at once, but no more than the cores that are idle when
the run starts (other processes' load, read for 0.25 s: a core counts only when it sat idle 90% of that time and
no other thread waited to run; measured: on a 2-core machine under load 4-6, two threads made an MMoE step 20x
slower than one, and counting a half-idle core made auto 1.43x one thread beside four processes). The choice is
made once, at the start: load that comes later is not seen, and two runs of the same config that start under
different load may use different thread counts (whose float reductions may differ in the last bits); an integer
setting fixes it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from mtl_bench.settings import Setting, check_setting

# Below this many parameters a model's step gets one thread (scripts/bench_threads.py --sizes; docs/benchmarks.md,
# "Threads"). On a quiet 2-core machine a second thread changed the step of the MLPs up to 156k parameters by
# -13%..+11% (noise: median and best blocks disagree in sign) and sped up every larger one by 17-37%; on the
# same machine busy (load 4-6), a second thread made every size up to 8.4M 3-20x slower. LeNet on digits (9k
# parameters, but convolutions: more arithmetic per parameter) gains 7-15% from a second thread when quiet.
SMALL_MODEL_NUMEL = 200_000


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on: its CPU affinity (what taskset, cgroups' cpusets and SLURM allot)
    where the OS reports one, else every core of the machine."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        try:
            return set(getaffinity(0))
        except OSError:
            pass
    return set(range(os.cpu_count() or 1))


def available_cores() -> int:
    """How many cores this process may run on (`allowed_cpus`)."""
    return max(1, len(allowed_cpus()))


IDLE_WINDOW_S = 0.25  # how long auto watches the cores before choosing (this process sleeps meanwhile)
SAMPLES = 10  # reads of the runnable count over that window
# A core counts as free only when it sat idle this much of the window. Every parallel op waits for its slowest
# thread, so a thread on a core that another process holds half the time is not half a thread but a stall at
# each op: counting a half-idle core as free made auto 1.43x one thread with about four processes on 2 cores.
FREE_IDLE = 0.9


def _cpu_times(cpus: set[int]) -> dict[int, tuple[int, int]]:
    """{cpu: (idle jiffies, all jiffies)} of the given CPUs from /proc/stat (Linux); {} where it cannot be read."""
    times = {}
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *values = line.split()
                if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
                    continue
                jiffies = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
                times[int(name[3:])] = (jiffies[3] + jiffies[4], sum(jiffies))
    except (OSError, ValueError, IndexError):
        return {}
    return times


def _runnable() -> Optional[int]:
    """Threads runnable on the machine now (/proc/stat's procs_running, this one included); None where unknown."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("procs_running "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def idle_cores(window: float = IDLE_WINDOW_S) -> Optional[float]:
    """How many of the cores this process may use sat idle over the next `window` seconds (this process sleeps
    meanwhile, so what keeps them busy is other processes): from the per-CPU counters of /proc/stat, else those
    cores less the machine's one-minute load average; None where neither can be read. Where the process may use
    every core of the machine, also at most the cores less the other threads runnable in the window (the median
    of SAMPLES reads: processes that wait for the CPU leave no idle time to see, yet take a core's share)."""
    cpus = allowed_cpus()
    before = _cpu_times(cpus)
    if before:
        runnable = []
        for _ in range(SAMPLES):
            time.sleep(window / SAMPLES)
            count = _runnable()
            if count is not None:
                runnable.append(count - 1)  # less this thread, which is running while it reads
        after = _cpu_times(cpus)
        idle = 0.0
        for cpu, (idle0, total0) in before.items():
            idle1, total1 = after.get(cpu, (idle0, total0))
            idle += (idle1 - idle0) / (total1 - total0) if total1 > total0 else 1.0
        if runnable and len(cpus) >= (os.cpu_count() or 1):  # procs_running counts the whole machine
            idle = min(idle, float(max(0, len(cpus) - sorted(runnable)[len(runnable) // 2])))
        return idle
    try:
        return max(0.0, len(cpus) - os.getloadavg()[0])  # the load of the whole machine: an estimate
    except (AttributeError, OSError):
        return None


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
    ranks of a torchrun job on this machine (LOCAL_WORLD_SIZE), capped by the cores idle now (`idle_cores`; a
    core counts when idle FREE_IDLE of the window), at least 1.
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
    idle = idle_cores() if n > 1 else None
    busy = ""
    if idle is not None:
        free = max(1, int(idle + 1 - FREE_IDLE))  # a core idle FREE_IDLE of the window counts as free
        busy = f", {idle:.1f} of them idle now" + (" (other processes keep the rest busy)" if free < n else "")
        n = min(n, free)
    return n, (
        f"{_threads(n)} (trainer.num_threads=auto: {usable} cores this process may use{busy}{shared}; "
        f"{model_numel:,} parameters)"
    )
