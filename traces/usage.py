"""UsageError: the one exception for a mistake the user can fix (a bad flag, value or file).

The CLI prints its message as one line and exits 2. Never raised for a bug: those keep their traceback.
"""


class UsageError(Exception):
    """A mistake the user can fix: printed as one line, exit status 2."""
