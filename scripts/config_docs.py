"""Write docs/configuration.md from the options' declarations in mtl_bench/config.py (tests/docs/test_config_docs.py
checks that the committed page equals what this writes).

    python scripts/config_docs.py
"""

from __future__ import annotations

from pathlib import Path

from mtl_bench.config import options_markdown

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

HEADER = """# Configuration

An experiment is composed from config groups, each option one YAML under `conf/<group>/` that names its class by
`_target_`; the class's constructor is the one declaration of that option's keys (`mtl-bench list` shows the groups,
`mtl-bench train GROUP=OPTION --cfg job` an option's keys). The run-level options below are declared once in
`mtl_bench/config.py`, with the facts the resume check and `mtl-bench report` read.

- Every key you type is used or refused: an unknown key (`+trainer.max_step=100`, `+nonsense=1`) stops the run with
  one line naming the closest valid key. Free-form labels go under `tag`: `tag=baseline` or `+tag.lab=ours`.
- One way to say how long: `trainer.max_steps` or `trainer.epochs`. A length typed on the command line replaces the
  preset's; typing both is an error. `trainer=smoke` shortens any preset.
- Schedule lengths (`step_size`, `milestones`, `warmup_steps`) are optimizer steps, or `"<n> epochs"`, or `"<p>%"`
  of the run, so a preset's schedule stays right when the batch size or the run's length changes.
- A resumed run (`trainer.resume=auto` or a path) may change only the options marked "may change on resume".

## Run-level options

"""


def page() -> str:
    return HEADER + options_markdown()


if __name__ == "__main__":
    PAGE.write_text(page())
    print(f"wrote {PAGE}")
