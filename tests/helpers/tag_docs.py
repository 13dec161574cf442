"""The tag definitions of docs/tensorboard.md ("Every tag"), as patterns a logged tag must match."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tensorboard.md"


@lru_cache(maxsize=1)
def tag_patterns() -> dict[str, re.Pattern[str]]:
    """{documented tag: its pattern}: each row of the "Every tag" table, `<placeholder>` standing for one path
    component."""
    section = PAGE.read_text().split("\n## Every tag\n", 1)[1].split("\n## ", 1)[0]
    patterns = {}
    for line in section.splitlines():
        match = re.match(r"^\| `([^`]+)` \|", line)
        if match:
            tag = match.group(1)
            parts = re.split(r"(<[^>]+>)", tag)
            regex = "".join("[^/]+" if p.startswith("<") else re.escape(p) for p in parts)
            patterns[tag] = re.compile(rf"^{regex}$")
    return patterns


def undefined(tags: list[str] | set[str]) -> list[str]:
    """The tags no row of docs/tensorboard.md's "Every tag" defines."""
    patterns = tag_patterns().values()
    return sorted(tag for tag in tags if not any(p.match(tag) for p in patterns))


def logged_tags(run_dir: Path) -> set[str]:
    """Every scalar and image tag of a run's TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    found = events.Tags()
    return set(found["scalars"]) | set(found["images"])
