"""User-facing errors: the CLI prints their message on one line and exits with code 2."""


class SpecchatError(Exception):
    """An error caused by the user's input or environment, shown as one clear line."""
