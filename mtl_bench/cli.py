"""The `mtl-bench` command line: a typer app whose `train` hands its arguments to Hydra untouched."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Config-driven multi-task learning experiments in PyTorch.",
)


def _print_version(value: bool) -> None:
    if value:  # versions from the installed metadata: torch is not imported for it
        from importlib.metadata import PackageNotFoundError, version

        def installed(name: str) -> str:
            try:
                return version(name)
            except PackageNotFoundError:
                return "not installed"

        typer.echo(f"mtl-bench {installed('mtl-bench')} (torch {installed('torch')})")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and torch's, and exit."
    ),
) -> None:
    """mtl-bench: compose an experiment from config groups, train it, compare runs."""
    # A callback keeps `train` a subcommand even while it is the only one (typer's single-command rule).


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,  # `mtl-bench train --help` must reach Hydra's help, which lists the config groups
)
def train(ctx: typer.Context) -> None:
    """Train one experiment, or a sweep with -m. Arguments go to Hydra verbatim (see `mtl-bench train --help`)."""
    from mtl_bench.train import run_hydra_app  # lazy: `mtl-bench --help` must not import torch or hydra

    saved = sys.argv
    sys.argv = [saved[0], *ctx.args]  # Hydra reads sys.argv itself
    try:
        run_hydra_app()
    finally:
        sys.argv = saved


@app.command("list")
def list_options(group: str = typer.Argument(None, help="Only this group (model, tasks, balancer, ...).")) -> None:
    """List the config groups and their options."""
    from mtl_bench.catalog import config_options, format_config_options

    options = config_options()
    if group is None:
        typer.echo(format_config_options())
    elif group in options:
        typer.echo("\n".join(options[group]))
    else:
        typer.echo(f"mtl-bench: error: unknown group {group!r}; groups: {', '.join(options)}", err=True)
        raise typer.Exit(2)


@app.command(context_settings={"ignore_unknown_options": True})
def prepare(
    overrides: Optional[list[str]] = typer.Argument(
        None,
        metavar="OVERRIDES",
        help="GROUP=OPTION and KEY=VALUE, as the sweep's runs give them to `mtl-bench train` (tasks=... at least).",
        show_default=False,
    ),
) -> None:
    """Build a task set's cached data once, ahead of a sweep whose jobs would otherwise each build it.

    Composes the config as `mtl-bench train` does and builds only its task set (no model, no training).

    Examples: mtl-bench prepare tasks=qm9 ; mtl-bench prepare experiment=qm9_small tasks.cache_dir=/shared
    """
    from mtl_bench.errors import ConfigError
    from mtl_bench.prepare import prepare as prepare_tasks

    try:
        typer.echo(prepare_tasks(list(overrides or [])))
    except ConfigError as err:
        typer.echo(f"mtl-bench: error: {err}", err=True)
        raise typer.Exit(2) from None


@app.command()
def report(
    paths: list[Path] = typer.Argument(..., help="Run, sweep (multirun) or outputs/ directories; several are merged."),
    fmt: str = typer.Option("table", "--format", "-f", help="table (terminal), markdown, csv or json."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the report to this file."),
    baseline: Optional[str] = typer.Option(
        None,
        "--baseline",
        "-b",
        help="Δm against the group with these values (e.g. balancer=fixed), or 'reference' (tasks.reference).",
    ),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Write PNG plots here (needs matplotlib)."),
    wide: bool = typer.Option(False, "--wide", help="The per-metric table (mean ± 95% CI of every metric)."),
    published: Optional[str] = typer.Option(
        None, "--published", help="Show a paper's rows beside yours (nash_mtl, famo); Δm against its single-task row."
    ),
) -> None:
    """Compare runs: one row per group of equal configs with Δm (± 95% CI), mean rank and time per step, and the
    best group; --wide for every final test metric."""
    from mtl_bench.errors import ConfigError
    from mtl_bench.report.main import make_report

    try:
        if any(is_study_dir(path) for path in paths):
            text, written = study_report(paths, fmt, plots, baseline or published or (wide or None))
        else:
            text, written = make_report(paths, fmt, baseline, plots, wide=wide, published=published)
    except ConfigError as err:
        typer.echo(f"mtl-bench: error: {err}", err=True)
        raise typer.Exit(2) from None
    if output is None:
        typer.echo(text, nl=False)
    else:
        from mtl_bench.files import write_text

        write_text(output, text)
        typer.echo(f"report written to {output}", err=True)
    for path in written:
        typer.echo(f"plot written to {path}", err=True)


# The study's keys (study/spec.py's StudyConf; tests/test_cli.py checks the two agree), for `mtl-bench study --help`.
STUDY_KEYS = (
    "Study keys (KEY=VALUE; docs/study.md): name, about, experiment (the train overrides of every run), tasks, "
    "budget (trials per row), tune_seed, seeds (final seeds), select (delta_m | <task>/<metric>), reference "
    "(single_task | published), sampler_seed, space ({key: {loguniform|uniform: \\[lo, hi]} | {choice: \\[...]}}), "
    "methods (name: {balancer, keys, space}; ~methods.<name> drops one, methods={...} replaces them), "
    "scalarization (weights: loguniform | lattice | dirichlet; range: \\[lo, hi]), min_effect (Δm points the "
    "verdict should resolve), dir, launcher."
)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, epilog=STUDY_KEYS)
def study(
    ctx: typer.Context,
    preset: str = typer.Argument(..., help="A study preset (toy10, digits, qm9, nyuv2) or a study YAML path."),
) -> None:
    """Compare balancing methods fairly: tune each (and tuned scalarization, equal weights, single-task baselines)
    with the same budget on validation, train the chosen configs on several seeds, and report paired statistics.
    Overrides: study keys (budget=3 seeds=[1,2]) and Hydra launcher keys (hydra/launcher=joblib). Rerun to resume."""
    from hydra.errors import HydraException

    from mtl_bench.errors import ConfigError, Interrupted
    from mtl_bench.hydra_errors import describe
    from mtl_bench.study.driver import run_study
    from mtl_bench.study.table import load_results, render_study

    try:
        study_dir = run_study(preset, list(ctx.args))
        typer.echo(render_study(load_results(study_dir), "table"), nl=False)
    except Interrupted as err:  # one line was printed: where it stopped and the command that resumes the study
        raise typer.Exit(int(err.code or 1)) from None
    except ConfigError as err:
        typer.echo(f"mtl-bench: error: {err}", err=True)
        raise typer.Exit(2) from None
    except HydraException as err:  # the experiment's or the launcher's overrides do not compose
        typer.echo(f"mtl-bench: error: {describe(err)} (in the study's experiment or launcher overrides)", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"study dir: {study_dir} (mtl-bench report {study_dir} --format markdown|csv|json --plots DIR)")


def is_study_dir(path: Path) -> bool:
    from mtl_bench.study.table import is_study_dir as holds_study

    return holds_study(path)


def study_report(paths: list[Path], fmt: str, plots: Optional[Path], refused: object) -> tuple[str, list[Path]]:
    from mtl_bench.errors import ConfigError
    from mtl_bench.report.render import FORMATS
    from mtl_bench.study.table import load_results, render_study, write_study_plot

    if len(paths) != 1:
        raise ConfigError("a study directory is reported alone: give one path")
    if refused is not None:
        raise ConfigError("--baseline, --published and --wide are for runs; a study's report is against its reference")
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: allowed: {', '.join(FORMATS)}")
    results = load_results(paths[0])
    written = [write_study_plot(results, plots)] if plots is not None else []
    return render_study(results, fmt), written


def main() -> None:
    app()
