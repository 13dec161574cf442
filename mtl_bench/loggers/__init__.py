"""Where a run's scalars, images and hyper-parameters go (`logger=<option>`, several at once: see base.py)."""

from mtl_bench.loggers.base import Logger, Loggers, RunInfo
from mtl_bench.loggers.csv import CSVLogger
from mtl_bench.loggers.tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "Loggers", "RunInfo", "TensorBoardLogger"]
