"""Published result rows (report/published/<name>.yaml) shown beside the user's groups, marked as published.

Each file holds one paper: per task set (keyed by our `tasks` option: qm9, nyuv2, cityscapes, celeba) the table it
comes from, the single-task row `stl` its Δm is taken against (in our metric names and units), and per method the
mean rank `mr` and `delta_m` as printed, with `note`/`mr_note` where the printed numbers are inconsistent. Numbers
are never corrected here: a misprint is kept and noted.

Where a table's per-metric values are transcribed, `columns` names the paper's metric columns in order
(`[task, metric, up|down, factor]`: our names, the paper's arrow, and the factor from the printed unit to ours,
0.01 where the paper prints % and we store fractions) and `metrics` holds each method's values as printed, one
string per method in that order. The report then ranks the user's groups and these rows together on those
metrics (`joint_ranks`). `mr_base: 0` says the printed MRs count ranks from 0; `mr_inconsistent` and
`delta_m_inconsistent` list the methods whose printed MR or Δm does not follow from their printed metrics
(tests/report/test_published.py recomputes both).

`protocol` gives the paper's run length, split and model selection as our config keys (and the experiment preset
that sets them): a user's group that differs in one of them is reported as not comparable with the rows
(`protocol_gaps`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Optional, Sequence

from mtl_bench.errors import ConfigError

Metrics = dict[str, dict[str, float]]  # task -> metric -> value


@dataclass(frozen=True)
class Column:
    task: str
    metric: str
    higher_is_better: bool
    factor: float  # printed value × factor = the value in our units


@dataclass
class PublishedRow:
    method: str
    mr: Optional[float]
    delta_m: Optional[float]
    delta_m_std: Optional[float] = None
    note: str = ""
    printed: Optional[list[str]] = None  # the per-metric values as printed, in the table's `columns` order


@dataclass
class PublishedTable:
    source: str  # "nash_mtl"
    paper: str
    table: str
    stl: Optional[dict[str, dict[str, float]]]
    rows: list[PublishedRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    columns: list[Column] = field(default_factory=list)
    mr_base: int = 1  # the rank the paper gives the best method (FAMO's QM9 MRs count from 0)
    mr_inconsistent: list[str] = field(default_factory=list)
    delta_m_inconsistent: list[str] = field(default_factory=list)
    protocol: dict[str, Any] = field(default_factory=dict)  # config key -> the paper's value
    experiment: Optional[str] = None  # our preset that sets the protocol

    @property
    def has_metrics(self) -> bool:
        return bool(self.columns) and all(r.printed is not None for r in self.rows)

    def metrics(self, row: PublishedRow) -> Metrics:
        """The row's printed values in our metric names and units."""
        out: Metrics = {}
        for column, text in zip(self.columns, row.printed or []):
            out.setdefault(column.task, {})[column.metric] = float(text) * column.factor
        return out

    def printed_text(self, row: PublishedRow) -> dict[str, dict[str, str]]:
        """The row's values as printed, in our units (the printed digits scaled exactly: 39.29 % -> 0.3929)."""
        from decimal import Decimal

        out: dict[str, dict[str, str]] = {}
        for column, text in zip(self.columns, row.printed or []):
            scaled = Decimal(text) * Decimal(str(column.factor))
            out.setdefault(column.task, {})[column.metric] = text if column.factor == 1 else format(scaled, "f")
        return out

    @property
    def higher_is_better(self) -> dict[str, dict[str, bool]]:
        out: dict[str, dict[str, bool]] = {}
        for c in self.columns:
            out.setdefault(c.task, {})[c.metric] = c.higher_is_better
        return out


def joint_ranks(table: PublishedTable, groups: Sequence[Metrics]) -> tuple[list[Optional[float]], list[float]]:
    """Mean ranks of the user's groups (their metric means) and of the table's rows, ranked together on the
    paper's metrics only (1 = best, ties share the mean rank; stats.mean_ranks)."""
    from mtl_bench.analysis.stats import mean_ranks

    keep = table.higher_is_better
    mine = [{t: {m: v for m, v in ms.items() if m in keep.get(t, {})} for t, ms in g.items()} for g in groups]
    ranks = mean_ranks(mine + [table.metrics(r) for r in table.rows], keep)
    theirs = ranks[len(groups) :]
    assert all(r is not None for r in theirs)  # every row has every column (checked when loaded)
    return ranks[: len(groups)], [float(r) for r in theirs if r is not None]


LENGTH, SELECT = "trainer.epochs", "select"


def protocol_gaps(table: PublishedTable, settings: Optional[dict[str, Any]]) -> Optional[list[str]]:
    """How a group's config (summary.Group.settings) departs from the paper's protocol, one `key=value (paper:
    value)` each; [] when it follows it, None when the runs saved no config to tell (no .hydra/config.yaml)."""
    if not table.protocol:
        return []
    if settings is None:
        return None
    gaps = []
    for key, wanted in table.protocol.items():
        if key in ("select.criterion", "select.k") and settings.get(SELECT) != table.protocol.get(SELECT):
            continue  # another selection altogether: named once, by select
        value = settings.get(key)
        if value == wanted:
            continue
        if key == LENGTH and value is None and settings.get("trainer.max_steps") is not None:
            key, value = "trainer.max_steps", settings["trainer.max_steps"]  # the run's length was in steps
            gaps.append(f"{key}={_shown(value)} (paper: {LENGTH}={_shown(wanted)})")
        else:
            gaps.append(f"{key}={_shown(value)} (paper: {_shown(wanted)})")
    return gaps


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)


def available() -> list[str]:
    folder = resources.files("mtl_bench.report") / "published"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _columns(where: str, raw: Any) -> list[Column]:
    columns = []
    for item in raw or []:
        task, metric, arrow, factor = item
        if arrow not in ("up", "down"):
            raise ConfigError(f"{where}.columns: {item!r}: the arrow must be up or down")
        columns.append(Column(str(task), str(metric), arrow == "up", float(factor)))
    return columns


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _printed(where: str, table: dict[str, Any], rows: list[dict[str, Any]], n: int) -> dict[str, list[str]]:
    """Each method's printed values, checked against the rows and the number of columns."""
    values = {str(k): str(v).split() for k, v in (table.get("metrics") or {}).items()}
    methods = [r["method"] for r in rows]
    if values and sorted(values) != sorted(methods):
        raise ConfigError(f"{where}.metrics: methods {sorted(values)} differ from the rows' {sorted(methods)}")
    for method, tokens in values.items():
        if len(tokens) != n:
            raise ConfigError(f"{where}.metrics.{method}: {len(tokens)} values for {n} columns")
        bad = [t for t in tokens if not _is_number(t)]
        if bad:  # a typo fails here, not in the report
            raise ConfigError(f"{where}.metrics.{method}: {bad[0]!r} is not a number")
    return values


def load(name: str) -> dict[str, PublishedTable]:
    """The paper's tables by task set; an unknown name is a one-line ConfigError naming the files shipped."""
    import yaml

    names = available()
    if name not in names:
        raise ConfigError(f"--published {name!r}: allowed: {', '.join(names)}")
    data: dict[str, Any] = yaml.safe_load(
        (resources.files("mtl_bench.report") / "published" / f"{name}.yaml").read_text()
    )
    tables = {}
    for tasks, table in data["tables"].items():
        where = f"report/published/{name}.yaml: tables.{tasks}"
        columns = _columns(where, table.get("columns"))
        printed = _printed(where, table, table["rows"], len(columns))
        rows = [
            PublishedRow(
                r["method"],
                r.get("mr"),
                r.get("delta_m"),
                r.get("delta_m_std"),
                r.get("note", ""),
                printed.get(r["method"]),
            )
            for r in table["rows"]
        ]
        notes = [" ".join(str(table[k]).split()) for k in ("note", "mr_note") if table.get(k)]
        protocol = table.get("protocol") or {}
        tables[str(tasks)] = PublishedTable(
            name,
            data["paper"],
            table["table"],
            table.get("stl"),
            rows,
            notes,
            columns,
            int(table.get("mr_base", 1)),
            list(table.get("mr_inconsistent", [])),
            list(table.get("delta_m_inconsistent", [])),
            dict(protocol.get("keys") or {}),
            protocol.get("experiment"),
        )
    return tables
