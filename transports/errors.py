"""The root of flockring's exception hierarchy, kept on the lowest floor.

Transports sit below ``overlay`` and may not import it (docs/design.md, "Floors"), yet every error
the library raises must be catchable as ``overlay.OverlayError`` (docs/design.md, "Public API"). So
the root class lives here and ``overlay.errors`` re-exports it under that pinned name.
"""

from __future__ import annotations


class OverlayError(Exception):
    """Base class of every flockring error (re-exported as ``overlay.OverlayError``)."""


class TransportConfigError(OverlayError, ValueError):
    """A transport was configured or called with a value out of its documented range."""


class AddressError(OverlayError, ValueError):
    """A transport address that cannot be parsed (raised to API callers, never from a loop)."""


class WildcardAddressError(AddressError):
    """A node would advertise a wildcard address (``0.0.0.0`` / ``::``), which no peer can
    reach: give an address to advertise (``advertise=`` / ``--advertise``)."""
