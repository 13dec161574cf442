"""`mtl-bench study`: plan, tune, select, run the final seeds, write study.json; rerunning resumes.

The study directory holds study.yaml (the plan: the study's config and its tuning runs), index.json (every run:
id, phase, row, seed, settings, overrides, status), runs/<id>/ (ordinary run directories) and study.json (the
results). A run whose metrics.json says completed or diverged is never trained again; a run without one (killed,
failed) is launched again with trainer.resume=auto, so it continues from its last checkpoint. A study.yaml planned
with other settings is refused with one line naming the first key that differs.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml
from omegaconf import DictConfig

from mtl_bench.errors import RESUME_HINT_ENV, ConfigError, Interrupted
from mtl_bench.files import write_json, write_text
from mtl_bench.records import RunRecord, Status
from mtl_bench.study.plan import FINAL, TUNE, PlannedRun, final_runs, single_task_row, tuning_runs
from mtl_bench.study.spec import EQUAL, SCALARIZATION, load_study, plan_view
from mtl_bench.study.tuning import ValView, choose, choose_single_task, without_loss

PLAN_FILE, INDEX_FILE, RESULTS_FILE, RUNS_DIR = "study.yaml", "index.json", "study.json", "runs"
FINISHED = (Status.COMPLETED, Status.DIVERGED)  # outcomes a rerun keeps; any other state is trained (again)


def recorded_machine(study_dir: Path) -> Optional[str]:
    """The machine line index.json recorded, if any."""
    try:
        machine = json.loads((study_dir / INDEX_FILE).read_text()).get("machine")
    except (OSError, ValueError, AttributeError):
        return None
    return machine if isinstance(machine, str) else None


def first_difference(old: Any, new: Any, prefix: str = "") -> Optional[tuple[str, Any, Any]]:
    """The first key (dotted) where two plans differ, with both values."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in list(old) + [k for k in new if k not in old]:
            found = first_difference(old.get(key, "<absent>"), new.get(key, "<absent>"), f"{prefix}{key}.")
            if found:
                return found
        return None
    return None if old == new else (prefix.rstrip("."), old, new)


def check_plan(study_dir: Path, plan: dict[str, Any]) -> None:
    """Write study.yaml, or check that the one there is this plan."""
    path = study_dir / PLAN_FILE
    if path.exists():
        old = yaml.safe_load(path.read_text()) or {}
        diff = first_difference(
            {k: old.get(k) for k in ("study", "tasks", "tuning_runs")},
            {k: plan.get(k) for k in ("study", "tasks", "tuning_runs")},
        )
        if diff:
            key, was, now = diff
            raise ConfigError(
                f"{path} was planned with {key}={json.dumps(was)}, this command gives {json.dumps(now)}: rerun with "
                "the same settings, or give the study another dir=..."
            )
        return
    write_text(path, yaml.safe_dump(plan, sort_keys=False, allow_unicode=True))


class Study:
    def __init__(self, cfg: DictConfig, launcher: list[str], tasks: list[str]) -> None:
        self.cfg, self.launcher, self.tasks = cfg, launcher, tasks
        self.dir = Path(cfg.dir)
        self.runs_dir = self.dir / RUNS_DIR
        self.tuning = tuning_runs(cfg, tasks)
        self.final: list[PlannedRun] = []
        # The machine line: read before this session's first phase that trains runs (its load average says what
        # else ran; a later phase would read the study's own jobs); until then the one index.json recorded, so a
        # rerun that trains nothing never describes another machine than the one the runs ran on.
        self.machine: Optional[str] = recorded_machine(self.dir)
        self.machine_read_here = False
        self.records: dict[str, Optional[RunRecord]] = {}  # each run's metrics.json, read once (until it trains)

    def plan(self) -> dict[str, Any]:
        return {
            "about": self.cfg.about,
            "study": plan_view(self.cfg),
            "tasks": self.tasks,
            "tuning_runs": [{"id": r.id, "overrides": r.overrides} for r in self.tuning],
        }

    def record(self, run: PlannedRun) -> Optional[RunRecord]:
        """The run's metrics.json (None: not there), read once: a phase that trains runs forgets what it read."""
        if run.id not in self.records:
            self.records[run.id] = RunRecord.read(self.runs_dir / run.id)
        return self.records[run.id]

    def status(self, run: PlannedRun) -> str:
        record = self.record(run)
        if record is None:
            return "not started" if not (self.runs_dir / run.id).exists() else Status.INCOMPLETE.value
        return record.status_name

    def write_index(self) -> None:
        entries = [
            {**run.as_dict(), "dir": f"{RUNS_DIR}/{run.id}", "status": self.status(run)}
            for run in [*self.tuning, *self.final]
        ]
        write_json(self.dir / INDEX_FILE, {"machine": self.machine, "runs": entries})

    def run_phase(self, phase: str, runs: list[PlannedRun]) -> None:
        todo = [run for run in runs if self.status(run) not in FINISHED]
        if todo and not self.machine_read_here:
            from mtl_bench.analysis.machine import machine_description

            self.machine, self.machine_read_here = machine_description(), True
        resume = {run.id for run in todo if (self.runs_dir / run.id).exists()}
        print(
            f"study: {phase}: {len(runs)} runs, {len(runs) - len(todo)} already finished, {len(todo)} to run"
            + (f" ({len(resume)} resumed)" if resume else ""),
            flush=True,
        )
        self.write_index()
        from mtl_bench.study.launch import launch

        try:
            launch(todo, self.runs_dir, self.launcher, resume)
        finally:  # what they wrote is read again (also when the launch was interrupted: the index says it)
            for run in todo:
                self.records.pop(run.id, None)
        self.write_index()

    # ------------------------------------------------------------------ selection

    def views(self, row: str) -> tuple[list[PlannedRun], list[ValView]]:
        runs = [r for r in self.tuning if r.row == row]
        return runs, [ValView.of(self.record(r)) for r in runs]

    def reference_val(self, chosen: Mapping[str, PlannedRun]) -> Optional[dict[str, dict[str, float]]]:
        """Validation metrics Δm is selected against: the chosen single-task trials', or tasks.reference."""
        if self.cfg.reference == "published":
            return self.published_reference()
        reference = {}
        for task in self.tasks:
            run = chosen.get(single_task_row(task))
            if run is None:
                return None
            reference[task] = without_loss(ValView.of(self.record(run)).val)[task]
        return reference

    def published_reference(self) -> dict[str, dict[str, float]]:
        for run in self.tuning:
            record = self.record(run)
            if record and record.reference:
                return {t: {m: float(v) for m, v in ms.items() if m != "loss"} for t, ms in record.reference.items()}
        raise ConfigError("reference=published: the task set has no tasks.reference; use reference=single_task")

    def check_tasks(self) -> None:
        """The study's `tasks` must be the task set's: Δm would otherwise leave tasks out."""
        for run in self.tuning:
            record = self.record(run)
            if record and record.completed and run.row in self.rows:
                trained = list(record.higher_is_better or {})
                if sorted(trained) != sorted(self.tasks):
                    raise ConfigError(
                        f"tasks=[{','.join(self.tasks)}]: the experiment's task set has the tasks "
                        f"[{','.join(trained)}]; list those (or tasks=null to read them)"
                    )
                return

    def select(self) -> dict[str, PlannedRun]:
        self.check_tasks()
        chosen: dict[str, PlannedRun] = {}
        if self.cfg.reference == "single_task":
            for task in self.tasks:
                runs, views = self.views(single_task_row(task))
                best = choose_single_task(views, task)
                if best is not None:
                    chosen[single_task_row(task)] = runs[best]
        reference = self.reference_val(chosen) if self.cfg.select == "delta_m" else None
        if self.cfg.select == "delta_m" and reference is None:
            print("study: no single-task trial completed for every task: no Δm to select by", flush=True)
            return chosen
        for row in self.rows:
            runs, views = self.views(row)
            best = choose(views, self.cfg.select, reference)
            if best is None:
                print(f"study: {row}: no tuning trial completed; no final runs", flush=True)
            else:
                chosen[row] = runs[best]
        return chosen

    @property
    def rows(self) -> list[str]:
        return [EQUAL, SCALARIZATION, *self.cfg.methods]

    def check_final(self) -> None:
        for run in self.final:
            record = self.record(run)
            if record and [o for o in record.overrides if not o.startswith("trainer.resume")] != run.overrides:
                raise ConfigError(
                    f"{self.runs_dir / run.id} was trained with other settings than the trial now chosen for "
                    f"{run.row}; remove that directory to train it again"
                )

    # ------------------------------------------------------------------ results

    def reference_test(self) -> Optional[dict[str, dict[str, float]]]:
        from mtl_bench.study.results import mean_metrics

        if self.cfg.reference == "published":
            return self.published_reference()
        reference: dict[str, dict[str, float]] = {}
        for task in self.tasks:
            records = [r for r in (self.record(run) for run in self.final if run.row == single_task_row(task)) if r]
            records = [r for r in records if r.completed]
            if not records:
                return None
            reference[task] = mean_metrics(records, "test")[task]
        return reference

    def not_learned(self) -> dict[str, str]:
        """The completed final runs that did not learn, with why (the plain report's check, analysis/learning.py)."""
        from mtl_bench.analysis.learning import not_learned
        from mtl_bench.analysis.runs import Run

        found = {}
        for run in self.final:
            record = self.record(run)
            if record and record.completed:
                reason = not_learned(Run(self.runs_dir / run.id, record))
                if reason is not None:
                    found[run.id] = reason
        return found

    def failures(self) -> dict[str, str]:
        """Why each final run that did not complete stopped (metrics.json's reason)."""
        found = {}
        for run in self.final:
            record = self.record(run)
            if record is None:
                found[run.id] = "no metrics.json (not run, or killed)"
            elif not record.completed:
                found[run.id] = f"{record.status_name}: {record.reason or ''}"
        return found

    def results(self, chosen: Mapping[str, PlannedRun], started: float) -> dict[str, Any]:
        from mtl_bench.study.results import summarize

        everything = [*self.tuning, *self.final]
        unlearned = self.not_learned()
        summary = summarize(
            [r.as_dict() for r in everything],
            {r.id: self.record(r) for r in everything},
            reference_kind=self.cfg.reference,
            reference_test=self.reference_test(),
            rows=self.rows,
            seeds=list(self.cfg.seeds),
            not_learned=unlearned,
            min_effect=self.cfg.min_effect,
        )
        return {
            "study": self.cfg.name,
            "about": self.cfg.about,
            "tasks": self.tasks,
            "budget": self.cfg.budget,
            "seeds": list(self.cfg.seeds),
            "tune_seed": self.cfg.tune_seed,
            "select": self.cfg.select,
            "chosen": {row: {"trial": run.id, "settings": run.settings} for row, run in chosen.items()},
            **summary,
            "runs": {r.id: self.status(r) for r in everything},
            "problems": {**self.failures(), **{i: f"did not learn: {why}" for i, why in unlearned.items()}},
            "machine": self.machine or "not recorded",
            "wall_time_s_this_session": round(time.perf_counter() - started, 1),
        }


def run_study(name_or_path: str, overrides: list[str]) -> Path:
    """Plan, run and summarise a study; returns its directory."""
    from mtl_bench.analysis.stats import require_libraries

    require_libraries()
    hydra_overrides = [o for o in overrides if o.lstrip("+~").startswith("hydra")]
    cfg = load_study(name_or_path, [o for o in overrides if o not in hydra_overrides])
    started = time.perf_counter()
    if cfg.tasks:
        tasks = list(cfg.tasks)
    else:
        from mtl_bench.study.launch import task_names

        tasks = task_names(list(cfg.experiment))
    study = Study(cfg, [*cfg.launcher, *hydra_overrides], tasks)
    from mtl_bench.study.launch import check_composes

    # A bad launcher, experiment or method key stops a new study before its plan is written (a plan once written
    # is kept: a fixed typo would be "a changed plan").
    first = list({run.row: run for run in reversed(study.tuning)}.values())
    check_composes(study.launcher, [] if (study.dir / PLAN_FILE).exists() else [run.overrides for run in first])
    study.dir.mkdir(parents=True, exist_ok=True)
    check_plan(study.dir, study.plan())
    command = " ".join(["mtl-bench study", shlex.quote(name_or_path), *map(shlex.quote, overrides)])
    hint = f"Resume the study with: {command}"
    os.environ[RESUME_HINT_ENV] = hint  # what a run stopped by a signal prints (and its launcher's workers inherit)
    try:
        study.run_phase(TUNE, study.tuning)
        chosen = study.select()
        study.final = final_runs(cfg, chosen)
        study.check_final()
        study.run_phase(FINAL, study.final)
    except (KeyboardInterrupt, Interrupted) as err:
        study.write_index()
        if isinstance(err, Interrupted):  # the run said where it stopped and how to resume
            raise
        message = f"study interrupted between runs; {study.dir / INDEX_FILE} is current. {hint}"
        print(f"mtl-bench: {message}", file=sys.stderr, flush=True)
        raise Interrupted(signal.SIGINT, message) from None
    finally:
        os.environ.pop(RESUME_HINT_ENV, None)
    write_json(study.dir / RESULTS_FILE, study.results(chosen, started))
    return study.dir
