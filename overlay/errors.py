"""Exception hierarchy. Every error the library raises derives from :class:`OverlayError`.

API misuse raises at once with a message that says what was wrong; malformed *network* input
never raises (it is dropped and counted by the receiver; docs/design.md, "The sans-io rule").
"""

from __future__ import annotations

from transports.errors import OverlayError, WildcardAddressError

__all__ = [
    "ConfigError",
    "DuplicateApplicationError",
    "InvalidIdError",
    "JoinError",
    "NotReadyError",
    "OverlayError",
    "UnknownApplicationError",
    "WildcardAddressError",
]


class InvalidIdError(OverlayError, ValueError):
    """A NodeId value outside [0, 2**160) or a malformed hex/bytes form."""


class ConfigError(OverlayError, ValueError):
    """A configuration value out of its documented range."""


class NotReadyError(OverlayError):
    """An operation that needs a joined (ready) node was called before the join finished."""


class JoinError(OverlayError):
    """Joining the overlay failed (no seed answered, or the join timed out)."""

    def __init__(self, message: str, tried: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.tried = tried


class UnknownApplicationError(OverlayError, KeyError):
    """A route names an application that is not registered on this node."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown application"


class DuplicateApplicationError(OverlayError, ValueError):
    """An application name was registered twice on one node."""
