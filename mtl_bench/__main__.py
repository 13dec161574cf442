"""`python -m mtl_bench train ...` (also what torchrun launches: `torchrun -m mtl_bench train ...`)."""

from mtl_bench.cli import main

main()
