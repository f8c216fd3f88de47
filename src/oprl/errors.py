"""The one exception type for user mistakes.

Anything raised as ``OprlError`` is a problem with the user's input (config, file, data); the CLI prints its
message on one line and exits non-zero without a traceback. Everything else is a bug and keeps its traceback
under ``--debug``.
"""


class OprlError(Exception):
    """A user-facing error whose message names the culprit (config key, file, row)."""
