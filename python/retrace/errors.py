"""retrace's errors in Python: the classes of the C++ library's one hierarchy (include/retrace/error.h).

Every error a retrace call raises is a retrace.Error whose message is the CLI's text (what, where,
what to do) and whose ``exit_code`` is the one the CLI exits with for it (docs/reliability.md,
"Exit codes"): a damaged run directory gives the same class and code from Python as from
``retrace resume`` or ``retrace verify``.
"""


class Error(Exception):
    """Any retrace error. ``exit_code``: the CLI's exit code for it."""

    exit_code = 1

    def __init__(self, message="", exit_code=None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = int(exit_code)


class ConfigError(Error, ValueError):
    """Bad usage or configuration (exit 2)."""

    exit_code = 2


class FormatError(Error):
    """A corrupt, truncated or unreadable input file (exit 3)."""

    exit_code = 3


class IntegrityError(Error):
    """Data that does not verify: a checksum, digest or hash chain (exit 3)."""

    exit_code = 3


class IoError(Error, OSError):
    """The environment: a missing file, an unwritable directory, a device (exit 4)."""

    exit_code = 4


class InvariantError(Error):
    """An invariant of retrace itself broke: a bug, please report it (exit 70)."""

    exit_code = 70
