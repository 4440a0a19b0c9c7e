"""The pieces of a policy: actions, peers and their names, patterns, rules, sharing rules.

See :mod:`discovery.policy` for the theory of operation (Butt et al. 2006 §3.4; Epema et al.
1996 §3.1; Thain et al. 2004). Kept apart from the :class:`~discovery.policy.Policy` class so
that the file loader (:mod:`discovery.policy_file`) and the class both build on it without
importing each other.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from typing import Final

import attrs

from overlay.errors import OverlayError
from overlay.handle import NodeHandle

__all__ = [
    "ACCEPT_FLOCK_FROM",
    "ACTIONS",
    "ANNOUNCE_FROM",
    "BLACKLIST_FROM",
    "BLACKLIST_TO",
    "DENY_BY_DEFAULT",
    "FLOCK_TO",
    "INVITE_FROM",
    "QUERY_FROM",
    "Agreement",
    "Pattern",
    "Peer",
    "PolicyError",
    "Rule",
    "Sharing",
    "UserRule",
    "collector_host",
]

ANNOUNCE_FROM: Final = "announce-from"
FLOCK_TO: Final = "flock-to"
ACCEPT_FLOCK_FROM: Final = "accept-flock-from"
QUERY_FROM: Final = "query-from"
INVITE_FROM: Final = "invite-from"
#: whose blacklists we adopt, and to whom we send ours (Butt et al. 2006 §3.2.1: pools "can
#: dynamically learn of 'black listed' pools from other trusted pools")
BLACKLIST_FROM: Final = "blacklist-from"
BLACKLIST_TO: Final = "blacklist-to"
#: every action a policy file may name
ACTIONS: tuple[str, ...] = (
    ANNOUNCE_FROM,
    FLOCK_TO,
    ACCEPT_FLOCK_FROM,
    QUERY_FROM,
    INVITE_FROM,
    BLACKLIST_FROM,
    BLACKLIST_TO,
)
#: actions whose default is deny: trust is given by name, never by default — a pool that
#: adopted anyone's blacklist could be cut off from every pool by one liar, and one that sent
#: its blacklist to anyone would publish which pools failed it
DENY_BY_DEFAULT: tuple[str, ...] = (BLACKLIST_FROM, BLACKLIST_TO)

#: how long a pool that failed or evicted our jobs is skipped. Butt et al. 2006 §3.2.1 names the
#: learned blacklist but no duration; 30 min is 30 Flocking Manager periods (long enough not to
#: retry a failing pool at once, short enough that a restarted pool is used again soon).
DEFAULT_BLACKLIST_S = 1800.0

DIRECTIONS = ("both", "to", "from")


class PolicyError(OverlayError, ValueError):
    """A policy file that cannot be read or is malformed: names the file, line and problem."""

    def __init__(self, source: str, line: int | None, reason: str) -> None:
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {reason}")
        self.source = source
        self.line = line
        self.reason = reason


# ------------------------------------------------------------------------------ peers
def collector_host(contact: str) -> str:
    """The host part of a collector contact string (``host``, ``host:port``, ``[v6]:port`` or a
    sinful string ``<1.2.3.4:9618?...>``), lower-cased."""
    s = contact.strip()
    if s.startswith("<") and s.endswith(">"):
        s = s[1:-1]
    s = s.split("?", 1)[0]
    if s.startswith("["):
        end = s.find("]")
        return (s[1:end] if end > 0 else s[1:]).lower()
    if s.count(":") == 1:
        s = s.split(":", 1)[0]
    return s.lower()


def _address_host(address: str) -> str:
    """``udp://10.1.2.3:9000`` → ``10.1.2.3``; ``[::1]:9000`` → ``::1``; other text unchanged."""
    s = address.split("://", 1)[1] if "://" in address else address
    s = s.split("/", 1)[0]
    if s.startswith("["):
        end = s.find("]")
        return s[1:end] if end > 0 else s[1:]
    if s.count(":") == 1:
        return s.split(":", 1)[0]
    return s


@attrs.frozen(slots=True)
class Peer:
    """The names a policy can match a remote pool by (any may be empty when unknown)."""

    #: 40 lower-case hex digits of the pool's node id
    node_id: str = ""
    #: host name of the pool's central manager (from its signed announcement), lower-case
    host: str = ""
    #: its overlay address (``udp://ip:port`` live, a node index in the simulator)
    address: str = ""

    @classmethod
    def from_handle(cls, handle: NodeHandle, host: str = "") -> Peer:
        """A peer from an overlay handle, with the collector host when it is known."""
        return cls(f"{int(handle.id):040x}", host.lower(), str(handle.address))

    @classmethod
    def parse(cls, name: str) -> Peer:
        """A peer from one name: 40 hex digits are a node id, anything else a collector
        contact string or host name (how a pool model names the origin of a remote job)."""
        s = name.strip().lower()
        if len(s) == 40 and all(ch in "0123456789abcdef" for ch in s):
            return cls(node_id=s)
        return cls(host=collector_host(s))


# ------------------------------------------------------------------------------ patterns
_HEX_GLOB = re.compile(r"^[0-9a-f*?\[\]!-]+$")


@attrs.frozen(slots=True)
class Pattern:
    """One compiled allow/deny pattern (see the module docstring for the syntax)."""

    kind: str  # "id" | "host" | "addr" | "any"
    glob: str
    text: str
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None

    @property
    def universal(self) -> bool:
        """True for ``*`` (and ``id:*`` …): matches every peer, known or not."""
        return self.network is None and set(self.glob) == {"*"}

    def matches(self, peer: Peer) -> bool:
        """Does this pattern match ``peer``?"""
        if self.universal:
            return True
        if self.kind == "id":
            return bool(peer.node_id) and fnmatch.fnmatchcase(peer.node_id, self.glob)
        if self.kind == "host":
            return bool(peer.host) and fnmatch.fnmatchcase(peer.host, self.glob)
        if self.kind == "addr":
            return self._match_addr(peer.address)
        return (bool(peer.host) and fnmatch.fnmatchcase(peer.host, self.glob)) or (
            self._match_addr(peer.address)
        )

    def _match_addr(self, address: str) -> bool:
        if not address:
            return False
        host = _address_host(address).lower()
        if self.network is not None:
            try:
                return ipaddress.ip_address(host) in self.network
            except ValueError:
                return False
        return fnmatch.fnmatchcase(address.lower(), self.glob) or fnmatch.fnmatchcase(
            host, self.glob
        )


def compile_pattern(text: str) -> Pattern:
    """Compile one pattern; raises ``ValueError`` saying what is wrong with it."""
    if not isinstance(text, str):
        raise ValueError(f"a pattern must be a string, got {type(text).__name__}")
    s = text.strip()
    if not s:
        raise ValueError("empty pattern")
    kind, body = "any", s
    low = s.lower()
    for prefix in ("id:", "host:", "addr:"):
        if low.startswith(prefix):
            kind, body = prefix[:-1], s[len(prefix) :].strip()
            break
    if not body:
        raise ValueError(f"pattern {text!r} has nothing after {kind!r}:")
    body = body.lower()
    if kind == "id":
        if not _HEX_GLOB.match(body):
            raise ValueError(f"pattern {text!r}: a node-id pattern is hex digits and wildcards")
        if sum(ch in "0123456789abcdef" for ch in body) > 40:
            raise ValueError(f"pattern {text!r}: a node id has at most 40 hex digits")
        if not any(ch in "*?[" for ch in body):
            body += "*"  # a bare hex string is a prefix
        return Pattern("id", body, s)
    network = None
    if kind == "addr" and "/" in body and "://" not in body:
        try:
            network = ipaddress.ip_network(body, strict=False)
        except ValueError as exc:
            raise ValueError(f"pattern {text!r}: not a CIDR block ({exc})") from None
    return Pattern(kind, body, s, network)


# ------------------------------------------------------------------------------ rules
@attrs.frozen(slots=True)
class Rule:
    """allow/deny patterns and the default of one action."""

    allow: tuple[Pattern, ...] = ()
    deny: tuple[Pattern, ...] = ()
    default: bool = True

    def decide(self, peer: Peer) -> bool:
        """Deny wins; then allow; then the default."""
        if any(p.matches(peer) for p in self.deny):
            return False
        if any(p.matches(peer) for p in self.allow):
            return True
        return self.default

    @property
    def open_to_anyone(self) -> bool:
        """Would a peer we know nothing about be allowed? (Default allow, no ``*`` deny.)"""
        return self.default and not any(p.universal for p in self.deny)

    @property
    def is_trivial(self) -> bool:
        """No patterns at all: every peer gets the default."""
        return not self.allow and not self.deny


@attrs.frozen(slots=True)
class Sharing:
    """The ``[sharing]`` table: pool-wide sharing rules."""

    #: Epema et al. 1996 §3.1: "the number of idle machines in his pool must exceed a certain
    #: threshold before transfers to it are allowed" — offer nothing while free <= this.
    share_threshold: int = 0
    #: count only machines idle for at least this long (0: every free machine counts)
    min_idle_s: float = 0.0
    #: advertise at most this many machines to anyone (None: no cap)
    max_machines: int | None = None
    #: Thain et al. 2004: at most this many of our machines at a time for one remote pool's
    #: jobs, enforced when a job claims a machine (None: no quota)
    quota: int | None = None
    #: at most this many of our machines at a time for one remote user's jobs (None: no quota)
    user_quota: int | None = None
    #: how long a pool that failed or evicted our jobs is skipped, seconds
    blacklist_s: float = DEFAULT_BLACKLIST_S


@attrs.frozen(slots=True)
class Agreement:
    """One ``[[agreement]]`` table: limits for the pools its ``peers`` patterns match."""

    peers: tuple[Pattern, ...]
    #: "both"; "to" (we may flock to them, they may not flock to us); "from" (the reverse)
    direction: str = "both"
    #: advertise at most this many free machines to these pools (sender-side check)
    max_machines: int | None = None
    #: at most this many of our machines at a time for these pools' jobs (claim time)
    quota: int | None = None
    #: only jobs of these remote users are accepted from these pools (empty: every user)
    users: tuple[str, ...] = ()
    #: jobs of these remote users are refused from these pools
    deny_users: tuple[str, ...] = ()
    #: line of the ``[[agreement]]`` header in the file (0 when built in code)
    line: int = 0

    def matches(self, peer: Peer) -> bool:
        """Whether ``peer`` matches any of this agreement's patterns."""
        return any(p.matches(peer) for p in self.peers)


@attrs.frozen(slots=True)
class UserRule:
    """One ``[[user]]`` table: a rule for remote users whose name matches ``name``."""

    name: str
    allow: bool = True
    quota: int | None = None

    def matches(self, user: str) -> bool:
        """Whether ``user`` matches this rule's shell-style ``name`` pattern (case-sensitive)."""
        return fnmatch.fnmatchcase(user, self.name)


def _default_rules() -> dict[str, Rule]:
    return {a: Rule(default=a not in DENY_BY_DEFAULT) for a in ACTIONS}
