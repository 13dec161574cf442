"""Compare benchmark tables of two trees: each row's ratio to the floor (`scripts/bench_balancers.py --peers`
tables) or one column of any table (--column), and the pooled after/before ratio with its 95% t interval.

    python scripts/bench_before_after.py --before b1.md b2.md --after a1.md a2.md
    python scripts/bench_before_after.py --column ms/step --before b1.md b2.md --after a1.md a2.md  # bench_bilevel

Run the bench on each tree, alternating (before, after, before, after), on the same machine, saving each table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.before_after import report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", nargs="+", type=Path, required=True, help="tables printed by the tree before")
    parser.add_argument("--after", nargs="+", type=Path, required=True, help="tables printed by the tree after")
    parser.add_argument("--column", default=None, help="compare this column of every row (default: peers' x floor)")
    args = parser.parse_args()
    for path in [*args.before, *args.after]:
        if not path.is_file():
            parser.error(f"{path}: no such file")
    print(report(args.before, args.after, args.column))


if __name__ == "__main__":
    main()
