"""The one exception type for user mistakes (bad config values, mismatched keys)."""


class ConfigError(ValueError):
    """A user error: the message is one line naming the bad key/value and what is allowed.

    The CLI prints it without a traceback and exits non-zero.
    """


# A driver that launches runs itself (`mtl-bench study`) resumes them with its own command: it sets this variable to
# the sentence a stopped run prints instead of its own hint.
RESUME_HINT_ENV = "MTL_BENCH_RESUME_HINT"


class ContractError(ConfigError):
    """A part (a user's weighting, aggregator or logger) broke its contract at run time: one line naming the part,
    what it gave and what the contract asks for, reported like a user error (the run's record says "failed")."""


class Interrupted(SystemExit):
    """SIGINT, SIGTERM or SIGUSR1 stopped the run after a step, with a checkpoint written; exits 128 + signal."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(128 + signum)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ResumeError(ConfigError):
    """trainer.resume cannot continue: the checkpoint is damaged or was trained with another config. Nothing
    in the run directory is changed (no failure record: the run it belongs to is intact)."""


class DivergedError(ConfigError):
    """Too many steps were skipped for non-finite losses or gradients (trainer.max_skipped_fraction): the run
    stops, one line, and metrics.json says "status": "diverged"."""


class NonFiniteLossError(ConfigError):
    """trainer.on_nonfinite=raise met a NaN/inf loss: reported like a user error (one line, non-zero exit)."""
