"""The one exception type for user mistakes (bad config values, mismatched keys)."""


class ConfigError(ValueError):
    """A user error: the message is one line naming the bad key/value and what is allowed.

    The CLI prints it without a traceback and exits non-zero.
    """


class NonFiniteLossError(ConfigError):
    """trainer.on_nonfinite=raise met a NaN/inf loss: reported like a user error (one line, non-zero exit)."""
