"""The one error type for bad input: the CLI prints its message on one line and exits 2."""


class BadInput(ValueError):
    """Input a user can fix: a bad config, scenario, trace, or option."""
