"""What the benchmark scripts in scripts/ share: models and runs built through the public API (`runs`),
interleaved timing rounds and markdown tables with ratios (`timing`), and the peer libraries' code loaded
from their installed files (`peers`, also used by the exactness tests; `encodec_balancer`, `nash_mtl_net`).

Beside scripts/ and outside the `mtl_bench` package: only scripts and tests use it, so the wheel does not ship it.
It is importable from a checkout with an editable install (its root is on sys.path) and from pytest (the root).
"""
