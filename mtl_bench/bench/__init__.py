"""What the benchmark scripts in scripts/ share: models and runs built through the public API (`runs`),
interleaved timing rounds and markdown tables with ratios (`timing`), and the peer libraries' code loaded
from their installed files (`peers`, also used by the exactness tests).

A package rather than a `scripts/_common.py`: tests import `peers` from here, mypy and ruff check it with the
rest of `mtl_bench`, and a script needs no `sys.path` edit to import it.
"""
