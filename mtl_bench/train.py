"""The Hydra application behind `mtl-bench train`.

Import cost matters: `mtl-bench train --help` and `--cfg job` import this module, so torch is
imported only inside the task function.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

import hydra
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

import mtl_bench.config  # noqa: F401  (registers the structured-config schemas before Hydra composes)
from mtl_bench.catalog import conf_root, format_config_options
from mtl_bench.config import options_summary
from mtl_bench.errors import ConfigError, Interrupted
from mtl_bench.hydra_errors import describe

HELP_WIDTH = 100

# The help template (conf/config.yaml, hydra.help) lists our groups and the most used keys through these
# resolvers, so the schema/* groups stay out of it and every line fits 100 columns.
OmegaConf.register_new_resolver("mtl_bench_config_groups", lambda: format_config_options(HELP_WIDTH), replace=True)
OmegaConf.register_new_resolver("mtl_bench_help_keys", lambda: options_summary(HELP_WIDTH), replace=True)


@hydra.main(version_base="1.3", config_path=str(conf_root()), config_name="config")
def hydra_main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        return run_experiment(cfg)
    except ConfigError as err:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            # The launcher records the failed job and runs the others; run_hydra_app reports it at the end.
            print(f"mtl-bench: error in this job: {err}", file=sys.stderr)
            raise
        # A user error: one line, no traceback, non-zero exit.
        print(f"mtl-bench: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def run_experiment(cfg: DictConfig) -> float:
    """Returns what sweepers (Optuna) minimise: the mean over tasks of the final val loss divided by the
    task's initial loss (L_i(0), measured on test before training), so that tasks of very different loss
    scales weigh the same."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from mtl_bench.errors import ResumeError
    from mtl_bench.records import previous_status, record_failure

    hydra_cfg = HydraConfig.get()
    choices = {
        group: option
        for group, option in hydra_cfg.runtime.choices.items()
        if not group.startswith("hydra") and option is not None
    }
    run_dir = Path(hydra_cfg.runtime.output_dir)
    overrides = list(hydra_cfg.overrides.task)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    subdir = hydra_cfg.output_subdir
    attempt_dir = run_dir / subdir if subdir and Path(subdir).parent.name == ATTEMPTS else None
    try:
        check_data_root(cfg, choices.get("tasks"))  # before torch is imported: a mistyped path costs no import
        from mtl_bench.engine.progress import use_bar
        from mtl_bench.engine.recipe import train
        from mtl_bench.engine.threads import cores_of, parallel_runs_of

        result = train(  # finalises the config (every key checked) before anything is built
            cfg,
            run_dir,
            overrides=overrides,
            choices=choices,
            bar=use_bar(cfg.trainer.progress, multirun) and int(os.environ.get("RANK", "0")) == 0,
            parallel_runs=parallel_runs_of(hydra_cfg.launcher),
            cores=cores_of(hydra_cfg.launcher),
            attempt_dir=attempt_dir,
        )
    except Exception as err:
        # train() records a failure once it has started building; a config it refused left no record
        if previous_status(run_dir) is None and not isinstance(err, ResumeError):
            if multirun:
                record_failure(run_dir, err, 0, overrides, choices)  # the sweep's report lists the job
            else:
                remove_if_only_hydras(run_dir)  # nothing was built: a typo leaves no run directory behind
        raise
    from mtl_bench.engine.recipe import loss_ratio_sum
    from mtl_bench.report.run_summary import format_run_summary

    if not multirun and int(os.environ.get("RANK", "0")) == 0:  # a sweep ends with its own summary table
        assert result.record is not None  # rank 0 of a completed run
        print(format_run_summary(result.record, run_dir), end="", flush=True)
    return loss_ratio_sum(result.val, result.initial_test) / len(result.val)


def check_data_root(cfg: DictConfig, option: str | None) -> None:
    """A `tasks.root` that is set but is no folder, as one line, before the engine (and torch) is imported: the
    task set's own check says the same, with its layout, 10+ s later (a null root is left to it: whether a task set
    needs one is its signature's to say)."""
    try:
        root = OmegaConf.select(cfg, "tasks.root")
    except Exception:  # an interpolation that does not resolve, a missing value: the full checks name it
        return
    if root is None or str(root).strip() == "":
        return
    path = Path(str(root)).expanduser()
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        reads = f"tasks={option}" if option else "the task set"
        raise ConfigError(f"tasks.root: {path} {what}; {reads} reads its data from this folder")


# A second attempt in a run directory (a resume in place) writes its .hydra/ record and log under
# .hydra/attempts/<n>/; they replace the run's own only when the attempt writes a checkpoint (engine/checkpoint.py:
# RunState.promote, called by engine.recipe.train, which is given the attempt's directory).
ATTEMPTS = "attempts"


def attempt_overrides(argv: list[str]) -> list[str]:
    """Hydra's overrides that send this attempt's .hydra/ files (and log) to .hydra/attempts/<n>/ when the run
    directory given (hydra.run.dir) already holds a run's .hydra/ record; [] otherwise (a new run, a sweep)."""
    no_run = ("-m", "--multirun", "-c", "--cfg", "-i", "--info", "-h", "--help", "--hydra-help", "--shell-completion")
    if any(a.split("=", 1)[0] in no_run for a in argv):
        return []
    given = [o.split("=", 1)[1] for o in hydra_overrides(argv) if o.startswith("hydra.run.dir=")]
    if not given or not (Path(given[-1]) / ".hydra" / "config.yaml").is_file():
        return []
    hydra_dir = Path(given[-1]).resolve() / ".hydra"
    attempts = hydra_dir / ATTEMPTS
    n = 1 + max((int(p.name) for p in attempts.glob("*") if p.name.isdigit()), default=0)
    extra = [f"hydra.output_subdir=.hydra/{ATTEMPTS}/{n}"]
    log_file = hydra_dir / ATTEMPTS / str(n) / "train.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)  # Hydra opens the log before it writes the .hydra files
    if not any(o.startswith(("hydra/job_logging", "hydra.job_logging")) for o in argv) and "'" not in str(log_file):
        extra.append(f"hydra.job_logging.handlers.file.filename='{log_file}'")
    return extra


def remove_if_only_hydras(run_dir: Path) -> None:
    """Remove a run directory that holds nothing but what Hydra wrote when the job started."""
    if not run_dir.is_dir() or not all(p.name == ".hydra" or p.suffix == ".log" for p in run_dir.iterdir()):
        return
    logging.shutdown()  # the job's log file handler
    shutil.rmtree(run_dir, ignore_errors=True)


def run_hydra_app() -> None:
    """Run `hydra_main` on sys.argv; a config that does not compose is one error line and exit status 2.

    Hydra prints composition errors over several lines with exit status 1 unless HYDRA_FULL_ERROR is set,
    in which case it raises them: we set it for the call and turn the exception into one line.
    """
    if int(os.environ.get("RANK", "0")) > 0:
        # torchrun: ranks other than 0 write nothing (rank 0's run dir is shared with them by broadcast).
        sys.argv += [
            "hydra.run.dir=.",
            "hydra.output_subdir=null",
            "hydra/job_logging=disabled",
            "hydra/hydra_logging=disabled",
        ]
    problem = flags_after_overrides(sys.argv[1:])
    if problem:
        print(f"mtl-bench: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    if int(os.environ.get("RANK", "0")) == 0:
        sys.argv += attempt_overrides(sys.argv[1:])
    saved = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra_main()
    except Interrupted as err:  # a signal stopped the run: its checkpoint, records and loaders are closed
        exit_now(int(err.code or 1))
    except KeyboardInterrupt:  # Ctrl-C outside the training steps (building, the first or last evaluation)
        print(
            "mtl-bench: interrupted by SIGINT outside the training steps; the run's checkpoints/last.pt, if it has "
            "one, is its last complete checkpoint",
            file=sys.stderr,
        )
        exit_now(128 + signal.SIGINT)
    except CompactHydraException as err:  # composition and override-parsing errors
        from mtl_bench.engine.compose import part_keys

        print(f"mtl-bench: error: {describe(err, part_keys(hydra_overrides(sys.argv[1:])))}", file=sys.stderr)
        raise SystemExit(2) from None
    except ConfigError as err:  # a sweep's failed job, raised by Hydra after every job of the sweep ran
        print(
            f"mtl-bench: error: a job of the sweep failed ({err}); the other jobs ran: "
            "mtl-bench report <sweep dir> lists them all",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    except OSError as err:  # the run directory (Hydra creates it) or a file in it cannot be written
        where = f" {err.filename}" if err.filename else ""
        print(
            f"mtl-bench: error: cannot write{where}: {err.strerror or err} (set hydra.run.dir to a writable directory)",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    except ValueError as err:
        if not str(err).startswith("Only one of --run"):  # Hydra's check of its own flags
            raise
        print(f"mtl-bench: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        if saved is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved


def hydra_overrides(argv: list[str]) -> list[str]:
    """The overrides among Hydra's command-line arguments (its flags and their values left out)."""
    from hydra._internal.utils import get_args_parser

    known, rest = get_args_parser().parse_known_args(argv)
    return [*known.overrides, *rest]


def flags_after_overrides(argv: list[str]) -> str | None:
    """Hydra's parser takes its flags before the overrides only (`balancer=fixed -m seed=0,1` leaves `seed=0,1`
    unrecognized): the line that says so and gives the command in order, or None."""
    from hydra._internal.utils import get_args_parser

    known, rest = get_args_parser().parse_known_args(argv)
    if not rest or any(item.startswith("-") for item in rest):  # an unknown flag: Hydra's own error names it
        return None
    overrides = {*known.overrides, *rest}
    flags = [item for item in argv if item not in overrides]
    ordered = " ".join([*flags, *(item for item in argv if item in overrides)])
    return (
        f"{rest[0]} comes after Hydra's flag{'s' if len(flags) > 1 else ''} {' '.join(flags)}: Hydra's flags go "
        f"before the overrides: mtl-bench train {ordered}"
    )


def exit_now(code: int) -> None:
    """Exit as a stopped run should, at once: the exit handlers run (log files, worker processes), the
    interpreter's teardown of torch's modules does not (1.5-3 s on a shared 2-core machine: docs/training.md)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_hydra_app()
