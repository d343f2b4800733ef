"""The one exception type for errors a user can cause.

Every layer raises `StreamStudioError` (or a subclass) with a message that says what went
wrong and what to do; the CLI prints the message without a traceback and the web app shows
it in the session that caused it.
"""


class StreamStudioError(ValueError):
    """An error the user can fix: bad input, bad settings, a missing model or device."""


class ModelNotFoundError(StreamStudioError):
    """The weights of a named model cannot be had (offline, not cached, wrong path)."""
