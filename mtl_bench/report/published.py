"""Published result rows (report/published/<name>.yaml) shown beside the user's groups, marked as published.

Each file holds one paper: per task set (keyed by our `tasks` option: qm9, nyuv2, cityscapes, celeba) the table it
comes from, the single-task row `stl` its Δm is taken against (in our metric names and units), and per method the
mean rank `mr` and `delta_m` as printed, with `note`/`mr_note` where the printed numbers are inconsistent. Numbers
are never corrected here: a misprint is kept and noted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Optional

from mtl_bench.errors import ConfigError


@dataclass
class PublishedRow:
    method: str
    mr: Optional[float]
    delta_m: Optional[float]
    delta_m_std: Optional[float] = None
    note: str = ""


@dataclass
class PublishedTable:
    source: str  # "nash_mtl"
    paper: str
    table: str
    stl: Optional[dict[str, dict[str, float]]]
    rows: list[PublishedRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def available() -> list[str]:
    folder = resources.files("mtl_bench.report") / "published"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


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
        rows = [
            PublishedRow(r["method"], r.get("mr"), r.get("delta_m"), r.get("delta_m_std"), r.get("note", ""))
            for r in table["rows"]
        ]
        notes = [" ".join(str(table[k]).split()) for k in ("note", "mr_note") if table.get(k)]
        tables[str(tasks)] = PublishedTable(name, data["paper"], table["table"], table.get("stl"), rows, notes)
    return tables
