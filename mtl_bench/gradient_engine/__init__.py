"""The gradient engine: per-task gradients, J's blocks, the Gramian, writing `.grad`, DDP averaging, and the adapters
that run a method of mtl_bench/balancers (a Weighting, an aggregator, a loss weighting) as the training step's
balancer. Nothing here is a method; each method is one file in mtl_bench/balancers."""
