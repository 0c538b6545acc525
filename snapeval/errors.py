"""The one exception type users see: a config or input problem, reported in one line."""


class SnapevalError(Exception):
    """A user-facing error: bad config, missing data, unreachable model.

    The command-line entry points print ``error: <message>`` and exit non-zero,
    without a traceback. ``field`` names the config key at fault, when there is one.
    """

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)
