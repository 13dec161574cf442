"""The console log handler named in conf/hydra/job_logging/rich.yaml."""

from __future__ import annotations

import logging
import sys


def console_handler() -> logging.Handler:
    """Rich on a terminal (log lines render above the progress bar); plain timestamped lines otherwise,
    so redirected output (files, sweeps, cluster jobs) is not wrapped at 80 columns."""
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(show_path=False, log_time_format="[%X]")
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(levelname)s] %(message)s", "%H:%M:%S"))
    return handler
