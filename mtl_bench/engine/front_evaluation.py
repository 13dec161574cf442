"""A preference-conditioned model's run (`model/front=<option>`): its build, its check against the balancer, the
preference it sees each step, and its evaluation at rays spread on the simplex (`trainer.front`): the loop's
`FrontEvaluation` callback."""

from __future__ import annotations

import inspect
import logging
import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

import numpy as np
import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from mtl_bench import tags
from mtl_bench.analysis.front_metrics import front_summary, hypervolume, require_pymoo
from mtl_bench.balancers import Balancer
from mtl_bench.balancers.preference import DIRICHLET, Preference, preference_of
from mtl_bench.catalog import conf_root
from mtl_bench.config import ENGINE_KEYS, TrainerConf
from mtl_bench.engine.builders import build, node_dict
from mtl_bench.engine.callbacks import Callback
from mtl_bench.engine.evaluate import evaluate
from mtl_bench.errors import ConfigError
from mtl_bench.figures import figure_pixels, front_figure
from mtl_bench.models import MultiTaskModel
from mtl_bench.models.fronts import PreferenceModel
from mtl_bench.tasks import TaskSet

if TYPE_CHECKING:
    from mtl_bench.engine.recipe import Recipe, TrainResult

log = logging.getLogger("mtl_bench")

Metrics = dict[str, dict[str, float]]

# A task set with a known front (`true_front(n)`): points recorded for IGD, and a denser sample for its hypervolume
# (20,001 points: below the continuous front's by ~1e-4 of it on tasks=pareto_toy; 501 for IGD keeps metrics.json
# small).
TRUE_FRONT_POINTS = 501
TRUE_FRONT_HV_POINTS = 20_001


def build_front_model(
    cfg: DictConfig, input_shape: Sequence[int], heads: Mapping[str, int]
) -> Optional[MultiTaskModel]:
    """The `model.front` option around the `model` option (which it builds itself, for the input it reads); None
    without a front."""
    front = OmegaConf.select(cfg, "model.front")
    if front is None:
        return None

    def model(**given: Any) -> MultiTaskModel:
        return build("model", cfg.model, MultiTaskModel, ignore=ENGINE_KEYS["model"], **given)

    return build("model.front", front, PreferenceModel, model=model, input_shape=input_shape, heads=heads)


def preference_balancers() -> list[str]:
    """The balancer options that can draw a preference each step: their class takes a `preference` and, built on two
    tasks with preference=dirichlet, its weighting holds a `Preference` that draws."""
    found = []
    for path in sorted((conf_root() / "balancer").glob("*.yaml")):
        target = yaml.safe_load(path.read_text()).get("_target_", "")
        module, _, name = str(target).rpartition(".")
        try:
            cls = getattr(__import__(module, fromlist=[name]), name)
        except (ImportError, AttributeError):
            continue
        if not isinstance(cls, type) or "preference" not in inspect.signature(cls).parameters:
            continue
        try:
            preference = preference_of(cls(task_names=["a", "b"], preference=DIRICHLET))
        except (TypeError, ValueError):  # it needs more to build, or its `preference` is another option
            continue
        if preference is not None and preference.draws:
            found.append(path.stem)
    return found


def check_front(model: MultiTaskModel, balancer: Balancer, cfg: DictConfig, conf: TrainerConf) -> None:
    """A front model trains on the preference the balancer draws each step; trainer.front needs a front model."""
    typed = OmegaConf.select(cfg, "model.front._target_")
    if not isinstance(model, PreferenceModel):
        if conf.front.rays or conf.front.preferences:
            raise ConfigError(
                "trainer.front: evaluates a preference-conditioned model; choose one with model/front=<option>"
            )
        return
    name = f"model/front={str(typed).rpartition('.')[2]}"
    preference = preference_of(balancer)
    if preference is None:
        raise ConfigError(
            f"balancer: {name} trains on a preference drawn each step, which {type(balancer).__name__} does not draw; "
            f"choose balancer={'|'.join(preference_balancers())} with balancer.preference=dirichlet"
        )
    if not preference.draws:
        raise ConfigError(
            f"balancer.preference: {name} needs a new preference each step: set balancer.preference=dirichlet"
        )


def simplex_rays(k: int, tasks: int) -> list[list[float]]:
    """k preferences spread on the simplex, from pymoo's reference directions: the Das-Dennis lattice where it has
    exactly k points (2 tasks: evenly spaced on the segment; 3 tasks and k = 10: thirds), else Riesz s-energy
    points (`energy`, seed 1: deterministic), which keep the corners. k = 1: the centre."""
    if k == 1 or tasks == 1:
        return [[1.0 / tasks] * tasks]
    require_pymoo()
    from pymoo.util.ref_dirs import get_reference_directions

    divisions = 1
    while math.comb(divisions + tasks - 1, tasks - 1) < k:
        divisions += 1
    if math.comb(divisions + tasks - 1, tasks - 1) == k:
        rays = get_reference_directions("das-dennis", tasks, n_partitions=divisions)
    else:
        rays = get_reference_directions("energy", tasks, k, seed=1)
    return [[float(x) for x in ray] for ray in rays]


def parse_preferences(values: Sequence[Any], tasks: Sequence[str]) -> list[list[float]]:
    """trainer.front.preferences: each [r_1..r_T] or {task: r}, >= 0, some > 0; scaled to sum 1."""
    rays = []
    for i, value in enumerate(values):
        key = f"trainer.front.preferences[{i}]"
        if isinstance(value, Mapping):
            if set(value) != set(tasks):
                raise ConfigError(f"{key}: name every task once: {', '.join(tasks)}; got {sorted(value)}")
            value = [value[t] for t in tasks]
        if not isinstance(value, (list, tuple)) or len(value) != len(tasks):
            raise ConfigError(f"{key}: expected {len(tasks)} numbers (tasks {', '.join(tasks)}), got {value!r}")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in value):
            raise ConfigError(f"{key}: every r_i must be a number >= 0, got {value!r}")
        total = float(sum(value))
        if not total > 0:
            raise ConfigError(f"{key}: at least one r_i must be > 0, got {value!r}")
        rays.append([float(v) / total for v in value])
    return rays


class FrontEvaluation(Callback):
    """What the loop does for a front model: set the step's preference before its forwards, the simplex's
    centre for the ordinary evaluations, and each ray for the front's (logged at each val evaluation; on val
    and test for metrics.json's `front` at the end)."""

    def __init__(
        self,
        model: PreferenceModel,
        preference: Preference,
        conf: TrainerConf,
        tasks: Sequence[str],
        reference: Optional[Mapping[str, float]],
    ) -> None:
        self.model, self.preference, self.tasks = model, preference, list(tasks)
        self.rays = (simplex_rays(conf.front.rays, len(tasks)) if conf.front.rays else []) + parse_preferences(
            conf.front.preferences or [], self.tasks
        )
        self.reference = check_reference(reference, self.tasks)
        self.warned = False

    def on_step_start(self, run: Recipe, logging_now: bool) -> None:
        self.before_step()

    def on_eval_start(self, run: Recipe, split: str) -> None:
        self.centre()  # a front model's ordinary metrics are at the simplex's centre

    def on_eval(self, run: Recipe, split: str, metrics: Metrics) -> None:
        if split == "val" and self.rays and run.step < run.total_steps:
            self.log(self.evaluate(lambda: at_ray(run, "val")), run.logger, run.step)

    def on_fit_end(self, run: Recipe, result: TrainResult) -> None:
        """The final model's front, on val and test."""
        if self.rays:
            fronts = {split: self.evaluate(lambda: at_ray(run, split)) for split in ("val", "test")}
            self.log(fronts["val"], run.logger, run.step)
            run.front_record = self.record(fronts)

    def before_step(self) -> None:
        """The balancer's preference of this step (the `pref` buffer of its weighting's `Preference`, until the
        balancer's step() commits the next one)."""
        self.model.set_preference(self.preference.pref)

    def centre(self) -> None:
        self.model.set_preference(torch.full((len(self.tasks),), 1.0 / len(self.tasks)))

    def evaluate(self, evaluate: Callable[[], Metrics]) -> list[Metrics]:
        """`evaluate()` (one split's metrics) at every ray; the centre again afterwards."""
        results = []
        try:
            for ray in self.rays:
                self.model.set_preference(torch.tensor(ray))
                results.append(evaluate())
        finally:
            self.centre()
        return results

    def record(self, splits: Mapping[str, list[Metrics]]) -> dict[str, Any]:
        """metrics.json's `front`: the rays, each split's metrics per ray, and the front's indicators on the test
        losses (hypervolume against `tasks.front_reference`, spacing)."""
        out: dict[str, Any] = {"tasks": self.tasks, "rays": self.rays, "reference_point": self.reference}
        for split, per_ray in splits.items():
            out[split] = per_ray
            out[f"{split}_indicators"] = front_summary(losses(per_ray, self.tasks), self.reference_point)
        return out

    def log(self, per_ray: list[Metrics], logger: Any, step: int) -> None:
        """The run's loggers: the val front's indicators (`front/val/<indicator>`) and its picture (`front/val`)."""
        if logger is None:
            return
        points = losses(per_ray, self.tasks)
        summary = front_summary(points, self.reference_point)
        logger.log_scalars({tags.front("val", k): v for k, v in summary.items()}, step)
        try:
            figure = front_figure({"val": points}, self.tasks, title=f"step {step}")
        except ConfigError as err:  # no matplotlib: the numbers are logged, the picture is not
            if not self.warned:
                log.warning("trainer.front: no front image in TensorBoard (%s)", err)
                self.warned = True
            return
        pixels = figure_pixels(figure)  # (H, W, 3) uint8 -> the loggers' (3, H, W) floats in 0..1
        logger.log_image("front/val", pixels.transpose(2, 0, 1).astype(np.float32) / 255.0, step)

    @property
    def reference_point(self) -> Optional[list[float]]:
        return None if self.reference is None else [self.reference[t] for t in self.tasks]


def at_ray(run: Recipe, split: str) -> Metrics:
    """`split`'s metrics at the preference the model holds (set by FrontEvaluation.evaluate)."""
    tasks, data = run.taskset.tasks, getattr(run.taskset, split)
    return evaluate(run.model, tasks, data, run.device, run.conf.eval_batch_size, run.conf.num_workers)


def losses(per_ray: Sequence[Metrics], tasks: Sequence[str]) -> list[list[float]]:
    """The front's points: each ray's loss per task (the objectives every front learner minimises)."""
    return [[m[t]["loss"] for t in tasks] for m in per_ray]


def check_reference(reference: Optional[Mapping[str, float]], tasks: Sequence[str]) -> Optional[dict[str, float]]:
    """tasks.front_reference: null or {task: loss > 0 ... any number}, every task named once."""
    if reference is None:
        return None
    if not isinstance(reference, Mapping) or set(reference) != set(tasks):
        raise ConfigError(f"tasks.front_reference: must name every task once ({', '.join(tasks)}), got {reference!r}")
    for task, value in reference.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"tasks.front_reference.{task}: must be a finite number, got {value!r}")
    return {t: float(reference[t]) for t in tasks}


def front_run(
    model: MultiTaskModel, balancer: Balancer, cfg: DictConfig, conf: TrainerConf, tasks: Sequence[str]
) -> Optional[FrontEvaluation]:
    """The loop's callback for a front model (None without one); build_parts checked the combination."""
    if not isinstance(model, PreferenceModel):
        return None
    preference = preference_of(balancer)
    assert preference is not None
    reference = node_dict(cfg.tasks).get("front_reference")
    return FrontEvaluation(model, preference, conf, tasks, reference)


def true_front_record(taskset: TaskSet, cfg: DictConfig) -> dict[str, Any]:
    """metrics.json's `true_front` for a task set that knows its front (a `true_front(n)` method giving n points of
    it, task order): {"tasks", "points", and with tasks.front_reference and pymoo "hypervolume" (the true front's,
    at that reference point)}; {} for any other task set, or when a task was dropped (trainer.only_tasks)."""
    front = getattr(taskset, "true_front", None)
    if front is None:
        return {}
    points = front(TRUE_FRONT_POINTS)
    if len(points[0]) != len(taskset.task_names):
        return {}
    record: dict[str, Any] = {"tasks": taskset.task_names, "points": points}
    reference = check_reference(node_dict(cfg.tasks).get("front_reference"), taskset.task_names)
    try:
        require_pymoo()
    except ConfigError:  # the report, which needs pymoo too, then says so
        return {"true_front": record}
    if reference is not None:
        point = [reference[t] for t in taskset.task_names]
        record |= {"reference_point": point, "hypervolume": hypervolume(front(TRUE_FRONT_HV_POINTS), point)}
    return {"true_front": record}
