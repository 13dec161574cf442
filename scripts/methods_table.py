"""docs/methods.md from the balancers' classes and YAMLs, so the page cannot drift from the code.

    python scripts/methods_table.py > docs/methods.md

One row per `conf/balancer/*.yaml`: kind, state (the buffers of a built instance), grad_source modes,
per-task mode, whether the method's tests cover AMP (a GradScaler) and DDP, and its test file; then each
method's paper (its module's first line) and reference (the `Reference:` sentence of its class docstring).
`tests/balancers/test_methods_table.py` checks that the committed page equals this script's output.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import textwrap
import typing
from pathlib import Path
from types import SimpleNamespace

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mtl_bench.balancers.validation_source import METHODS, needs_validation
from mtl_bench.catalog import conf_root
from mtl_bench.gradient_engine.balancer import Balancer
from mtl_bench.gradient_engine.gradient_balancer import GradientBalancer
from mtl_bench.gradient_engine.gramian_balancer import GramianBalancer
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer

ROOT = Path(__file__).resolve().parent.parent
TASKS = ["a", "b", "c"]
# The test file of what a family shares: AMP and DDP checks written once for every method of the family.
# the family's shared code path (the scalarizations share loss_weighting_balancer.py's functions)
FAMILY_TESTS = {
    GradientBalancer: "test_jacobian.py",
    LossWeightingBalancer: "test_scalarization.py",
}
WIDTH = 120


def target(path: Path) -> type[Balancer]:
    module, _, name = str(OmegaConf.load(path)["_target_"]).rpartition(".")
    return getattr(importlib.import_module(module), name)


def _unused(*args: object) -> None:
    raise AssertionError("the table reads a bilevel method's buffers only, never its validation source")


# A bilevel method's validation source, for its build: every method of the protocol, none ever called.
UNUSED_VALIDATION = SimpleNamespace(**{name: _unused for name in METHODS})


def build(cls: type[Balancer], options: dict) -> Balancer | None:
    """An instance on three tasks and a small shared layer, or None when it cannot be built here (an
    optional dependency missing)."""
    layer = torch.nn.Linear(2, 2)
    supplied = {
        "task_names": TASKS,
        "shared_params": list(layer.parameters()),
        "shared_layer": layer,
        "world_size": 1,
        "initial_losses_known": {t: None for t in TASKS},
        "validation": UNUSED_VALIDATION,
    }
    wanted = inspect.signature(cls).parameters
    try:  # nested config nodes (CR-MOGM's base) built as the engine builds them
        factory = instantiate({"_target_": f"{cls.__module__}.{cls.__name__}", **options}, _partial_=True)
        return factory(**{k: v for k, v in supplied.items() if k in wanted})
    except ImportError:
        return None


def kind(cls: type[Balancer]) -> str:
    if needs_validation(cls):
        return "bilevel"
    if (
        issubclass(cls, GradientBalancer)
        or "grad_source" in inspect.signature(cls).parameters
        or hasattr(cls, "grad_source")
    ):
        return "gradient"
    return "loss weighting"


def modes(cls: type[Balancer], options: dict, instance: Balancer | None) -> str:
    """The grad_source values the signature allows (a Literal), else the one a method without the option has
    (its `grad_source` attribute), else the YAML's."""
    param = inspect.signature(cls, eval_str=True).parameters.get("grad_source")
    if param is not None and typing.get_origin(param.annotation) is typing.Literal:
        return ", ".join(typing.get_args(param.annotation))
    return str(getattr(instance or cls, "grad_source", options.get("grad_source", "-")))


def state(instance: Balancer | None) -> list[str]:
    """What `state_dict()` keeps: the buffers, and "generator" for a random generator's state."""
    if instance is None:
        return ["?"]
    names = [name for name in instance.state_dict() if not name.endswith("_extra_state")]
    if any(name.endswith("_extra_state") for name in instance.state_dict()):
        names.append("generator")
    return names


def state_kind(names: list[str]) -> str:
    random = "generator" in names
    learned = [n for n in names if n != "generator"]
    return ", ".join([*(["buffers"] if learned else []), *(["random"] if random else [])]) or "none"


def test_files(cls: type[Balancer], instance: Balancer | None = None) -> list[Path]:
    own = ROOT / "tests" / "balancers" / f"test_{cls.__module__.rsplit('.', 1)[-1]}.py"
    # an on-graph loss weighting (a bilevel method's) runs a path of its own, which the family's file does not cover
    on_graph = getattr(getattr(instance, "weighting", None), "on_graph", False)
    family = [
        ROOT / "tests" / "balancers" / f for base, f in FAMILY_TESTS.items() if issubclass(cls, base) and not on_graph
    ]
    return [p for p in [own, *family] if p.is_file()]


def covered(files: list[Path], pattern: str) -> str:
    """own: the method's test file covers it; family: only its family's file (the shared code path); else no."""
    hits = [bool(re.search(pattern, p.read_text())) for p in files]
    if hits and hits[0] and files[0].name.startswith("test_") and not _is_family(files[0]):
        return "own"
    return "family" if any(hits) else "no"


def _is_family(path: Path) -> bool:
    return path.name in FAMILY_TESTS.values()


def reference(cls: type[Balancer], instance: Balancer | None) -> str:
    # a method's weighting or aggregator has the docstring (balancer=gramian's weighting is the user's choice)
    method = getattr(instance, "weighting", None) or getattr(instance, "aggregator", None)
    weighting = method if cls is not GramianBalancer else None
    doc = " ".join(
        line.strip() for line in inspect.getdoc(type(weighting) if weighting is not None else cls).splitlines()
    )
    # the sentence ends at a full stop, not at the one of "e.g." or "i.e." inside it
    found = re.search(r"References?: (.*?)(?<!\be\.g)(?<!\bi\.e)\.(?:\s|$)", doc)
    return found.group(1) if found else "none stated"


def paper(cls: type[Balancer]) -> str:
    doc = sys.modules[cls.__module__].__doc__ or ""
    return " ".join(doc.split("\n\n")[0].split())


def rows() -> list[dict[str, str]]:
    out = []
    for path in sorted((conf_root() / "balancer").glob("*.yaml")):
        cls = target(path)
        options = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if not k.startswith("_")}
        options.pop("diagnostics", None)  # an engine option, not the class's
        instance = build(cls, {k: v for k, v in options.items() if not isinstance(v, str) or "${" not in v})
        tests = test_files(cls, instance)
        per_task = "?" if instance is None else ("yes" if instance.per_task_problem() is None else "no")
        out.append(
            {
                "option": path.stem,
                "class": cls.__name__,
                "kind": kind(cls),
                "state": state_kind(state(instance)),
                "buffers": ", ".join(state(instance)) or "none",
                "grad_source": modes(cls, options, instance),
                "per-task": per_task,
                "AMP": covered(tests, r"GradScaler|scaler"),
                "DDP": covered(tests, r"ddp|DDP"),
                "test": tests[0].name if tests else "none",
                "host_solve": (instance or cls).HOST_SOLVE,
                "paper": paper(cls),
                "reference": reference(cls, instance),
            }
        )
    return out


def render() -> str:
    table = rows()
    columns = ["option", "class", "kind", "state", "grad_source", "per-task", "AMP", "DDP"]
    lines = [
        "# Balancing methods",
        "",
        "Generated by `python scripts/methods_table.py > docs/methods.md` from the classes in `mtl_bench.balancers`",
        "and their YAMLs under `conf/balancer/`; do not edit by hand (a test compares this page with the script).",
        "Each method is `mtl-bench train balancer=<option>`. state: what `state_dict()` keeps (buffers, listed below;",
        "a random generator). per-task: runs `trainer.step_mode=per_task`. AMP, DDP: whether a test trains it under a",
        "GradScaler or two DDP ranks: own (its file under tests/balancers/, named below), family (only the file of",
        "the code it shares: test_jacobian.py, test_scalarization.py) or no.",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for row in table:
        lines.append("| " + " | ".join(f"`{row[c]}`" if c == "option" else row[c] for c in columns) + " |")
    lines += [
        "",
        "## On a GPU: each step's one host synchronisation",
        "",
        "A step never reads the device (no `.item()`, no shape that depends on values, no linalg error check) except",
        "where a method solves its small T×T problem on the host: that solve's copy of the Gramian (or the program's",
        "data) is the step's one synchronisation; the device queue is empty after it, so the few reads that follow",
        "cost no wait. tests/engine/test_host_sync.py checks every option on the CPU (tests/helpers/host_sync.py).",
        "The other methods step without one. Methods with a host solve:",
        "",
    ]
    for row in table:
        if row["host_solve"]:
            lines.append(f"- `{row['option']}`: {row['host_solve']}")
    lines += ["", "## Papers and references", ""]
    for row in table:
        text = (
            f"- `{row['option']}`: {row['paper']} Reference: {row['reference']}. "
            f"State: {row['buffers']}. Test: tests/balancers/{row['test']}."
        )
        lines += textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
