"""An exception a stand-in raises to stop a call once the step under test has been reached (and
what it was handed recorded)."""


class Recorded(Exception):
    """Stops a call at the step under test."""
