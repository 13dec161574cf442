"""mtl-bench: config-driven multi-task learning experiments in PyTorch."""

__version__ = "0.1.0"
