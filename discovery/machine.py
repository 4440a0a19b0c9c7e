"""Each node's machine ClassAd: static attributes, dynamic ones read at query time, the stamp.

Theory of operation (PonD §3.1.1, §3.2.2, §4.2.2; Thain et al. 2004 §5): in PonD every resource
runs a ``condor_startd`` that produces its machine ClassAd, and matchmaking runs *at the
resource* against that ad, so the result is as fresh as the ad is at query time (PonD §4.1,
"matchmaking result staleness"). A :class:`MachineAd` therefore has three layers, merged into
one ``classad2.ClassAd`` each time :meth:`MachineAd.current` is called:

1. **static** attributes — from a file in ClassAd syntax (new ``[ ... ]`` or the old
   ``condor_status -long`` lines), or generated for simulations by :func:`random_machine_ad`;
2. **dynamic** attributes — read through a :class:`DynamicProvider` (``State``, ``Activity``,
   ``LoadAvg``, free ``Memory``, ...): :class:`DictProvider` for simulations and tests, and
   :class:`CondorStartdProvider` for a live node, which reads the local startd's ad through
   ``htcondor2`` (a collector query). No HTCondor daemon can run where this project is tested,
   so that provider is exercised only with recorded real-format ads: it was **not run against a
   live startd**;
3. the **stamp** (PonD §3.2.2): while the machine belongs to a Pool on Demand, the pond's job
   id and manager are added as ``PondJobId``/``PondManager`` and ``State`` reads ``"Claimed"``.

The provider is read synchronously inside the protocol core, so a provider must answer from
memory: the live provider keeps a snapshot that its driver refreshes off the event loop
(:meth:`CondorStartdProvider.refresh`), never on a query.

:func:`random_machine_ad` draws ``Memory``, ``Cpus``, ``Arch`` and PonD's synthetic
``ZipfAttribute`` (PonD §4.2.2: an integer 1–10, Zipf with skew 1.0, ~35 % of nodes at 1) from an
injected ``random.Random``, with small value sets so that ranks tie often (the negotiator order
must be exercised), and optionally a machine ``Rank`` that is not numeric or ``Requirements``
that cannot be evaluated.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs

from discovery.classads import ClassAd, QuerySyntaxError, parse_ad, parse_expr
from overlay.errors import OverlayError

__all__ = [
    "ARCHES",
    "CPUS",
    "MEMORY_MIB",
    "CondorStartdProvider",
    "DictProvider",
    "DynamicProvider",
    "MachineAd",
    "MachineAdError",
    "Stamp",
    "random_machine_ad",
    "zipf_value",
]

#: value sets of the generated ads (few values: many rank ties)
MEMORY_MIB = (512, 1024, 2048, 4096, 8192, 16384)
CPUS = (1, 2, 4, 8, 16)
ARCHES = ("X86_64", "X86_64", "X86_64", "aarch64", "ppc64le")
#: dynamic attributes a simulated machine starts with (as an idle startd reports them)
IDLE_DYNAMICS: Mapping[str, Any] = {"State": "Unclaimed", "Activity": "Idle", "LoadAvg": 0.0}


class MachineAdError(OverlayError):
    """A machine ad that cannot be used (unreadable file, misuse of the stamp)."""


@attrs.frozen(slots=True)
class Stamp:
    """The pond a machine belongs to (PonD §3.2.2): its job id, manager and pond number."""

    job_id: str
    manager: str  #: the manager's node id, 40 hex digits
    pond_id: int


class DynamicProvider(Protocol):
    """Dynamic machine attributes, read at query time (must answer from memory, at once)."""

    def dynamic(self) -> Mapping[str, Any]:
        """The current values of the dynamic attributes (ClassAd-compatible Python values)."""
        ...


class DictProvider:
    """Dynamic attributes held in a dict that the simulation (or a test) changes at will."""

    __slots__ = ("values",)

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self.values: dict[str, Any] = dict(IDLE_DYNAMICS if values is None else values)

    def dynamic(self) -> Mapping[str, Any]:
        """The dict itself (changes made through :meth:`set` show at the next query)."""
        return self.values

    def set(self, **values: Any) -> None:
        """Change some dynamic attributes (e.g. ``set(ZipfAttribute=3, LoadAvg=0.7)``)."""
        self.values.update(values)


class MachineAd:
    """One node's machine ClassAd: static + dynamic + stamp (module docstring)."""

    __slots__ = ("_ad", "_dyn_keys", "_static_state", "provider", "stamp")

    def __init__(self, static: ClassAd, provider: DynamicProvider | None = None) -> None:
        if not isinstance(static, ClassAd):
            raise MachineAdError(f"a machine ad needs a classad2.ClassAd, not {type(static)}")
        self._ad = ClassAd()
        self._ad.update(static)
        self.provider = provider
        self.stamp: Stamp | None = None
        self._dyn_keys: tuple[str, ...] = ()
        self._static_state = static.get("State")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_text(cls, text: str, provider: DynamicProvider | None = None) -> MachineAd:
        """Parse static attributes (raises :class:`QuerySyntaxError` naming the bad line)."""
        return cls(parse_ad(text, "machine ad"), provider)

    @classmethod
    def from_file(cls, path: str | Path, provider: DynamicProvider | None = None) -> MachineAd:
        """Read static attributes from a file in ClassAd syntax (``--machine-ad FILE``)."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise MachineAdError(f"cannot read machine ad {p}: {exc.strerror or exc}") from None
        try:
            return cls.from_text(text, provider)
        except QuerySyntaxError as exc:
            raise QuerySyntaxError(f"{p}: {exc.what}", exc.text, exc.parser_message) from None

    # ------------------------------------------------------------------ reading
    def current(self) -> ClassAd:
        """The ad as it is now: static, then dynamic values, then the stamp.

        The same object is refreshed in place and returned on every call (a query evaluates
        it at once); callers must not keep or mutate it — :meth:`snapshot` gives a copy.
        """
        ad = self._ad
        if self.provider is not None:
            dyn = self.provider.dynamic()
            for k in self._dyn_keys:  # an attribute the provider stopped reporting is gone
                if k not in dyn:
                    ad.pop(k, None)
            for k, v in dyn.items():
                ad[k] = v
            if tuple(dyn) != self._dyn_keys:
                self._dyn_keys = tuple(dyn)
        st = self.stamp
        if st is not None:
            ad["PondJobId"] = st.job_id
            ad["PondManager"] = st.manager
            ad["State"] = "Claimed"
        return ad

    def snapshot(self) -> ClassAd:
        """A copy of :meth:`current` the caller may keep."""
        out = ClassAd()
        out.update(self.current())
        return out

    def project(self, names: Sequence[str], ad: ClassAd | None = None) -> str:
        """The current ad (or ``ad``, a :meth:`current` just taken) restricted to ``names``
        (those it has), as new-syntax ClassAd text: what a query returns of a matched machine
        (O(k) bytes per edge, PonD §4.1)."""
        if ad is None:
            ad = self.current()
        parts = []
        for n in names:
            e = ad.lookup(n) if n in ad else None
            if e is not None:
                parts.append(f"{n} = {e}")
        return "[ " + "; ".join(parts) + " ]"

    # ------------------------------------------------------------------ the pond stamp
    @property
    def claimed(self) -> bool:
        """Whether the ad carries a pond stamp (the machine belongs to a pond)."""
        return self.stamp is not None

    def set_stamp(self, stamp: Stamp) -> None:
        """Stamp the ad for a pond (PonD §3.2.2); a machine is in at most one pond."""
        if self.stamp is not None and self.stamp != stamp:
            raise MachineAdError(f"machine already stamped for pond {self.stamp.pond_id}")
        self.stamp = stamp

    def clear_stamp(self) -> None:
        """Leave the pond: the stamp attributes go, ``State`` is the provider's again."""
        if self.stamp is None:
            return
        self.stamp = None
        ad = self._ad
        ad.pop("PondJobId", None)
        ad.pop("PondManager", None)
        ad.pop("State", None)
        dyn = self.provider.dynamic() if self.provider is not None else {}
        if "State" in dyn:
            ad["State"] = dyn["State"]
        elif self._static_state is not None:
            ad["State"] = self._static_state

    def __repr__(self) -> str:
        name = self._ad.get("Name")
        return f"MachineAd({name!r}, claimed={self.claimed})"


# ---------------------------------------------------------------------- simulated ads
def zipf_value(rng: random.Random, n: int = 10, skew: float = 1.0) -> int:
    """An integer 1..n with P(i) ∝ 1/i^skew (PonD §4.2.2: n = 10, skew 1.0, ~35 % at 1)."""
    weights = [1.0 / (i**skew) for i in range(1, n + 1)]
    return rng.choices(range(1, n + 1), weights=weights)[0]


def random_machine_ad(
    rng: random.Random,
    name: str,
    *,
    odd_rank_fraction: float = 0.1,
    unevaluable_fraction: float = 0.0,
) -> ClassAd:
    """A machine ad for simulations: ``Memory``, ``Cpus``, ``Arch``, ``ZipfAttribute`` (PonD
    §4.2.2), ``OpSys``, ``Name``, a ``Requirements`` (the startd's START) and a ``Rank`` over
    jobs, all drawn from ``rng``.

    ``odd_rank_fraction`` of the ads get a machine ``Rank`` that is not a number (a string or
    an undefined attribute: the negotiator reads it as 0.0); ``unevaluable_fraction`` get a
    ``Memory`` that evaluates to ERROR, so that any job ``Requirements`` on it cannot be
    evaluated (a query must count it, not fail).
    """
    ad = ClassAd()
    ad["MyType"] = "Machine"
    ad["TargetType"] = "Job"
    ad["Name"] = name
    ad["Machine"] = name
    ad["OpSys"] = "LINUX"
    ad["Arch"] = rng.choice(ARCHES)
    ad["Cpus"] = rng.choice(CPUS)
    ad["Memory"] = rng.choice(MEMORY_MIB)
    ad["ZipfAttribute"] = zipf_value(rng)
    ad["KFlops"] = rng.randrange(500_000, 2_000_000, 250_000)
    # START as most pools write it: everything, or not for a blacklisted owner
    if rng.random() < 0.2:
        ad["Requirements"] = parse_expr('TARGET.Owner =!= "mallory"')
    else:
        ad["Requirements"] = True
    u = rng.random()
    if u < odd_rank_fraction / 2:
        ad["Rank"] = "not a number"
    elif u < odd_rank_fraction:
        ad["Rank"] = parse_expr("TARGET.NoSuchAttribute")
    else:  # owners preferring their department's jobs, or nothing
        ad["Rank"] = parse_expr('TARGET.Department =?= "physics"') if u < 0.5 else 0
    if unevaluable_fraction and rng.random() < unevaluable_fraction:
        ad["Memory"] = parse_expr("1 / 0")
    return ad


# ---------------------------------------------------------------------- live HTCondor
class CondorStartdProvider:
    """Dynamic attributes from the local ``condor_startd``'s ad, read through ``htcondor2``.

    :meth:`refresh` queries a collector for the startd ad named ``name`` (blocking: the live
    driver calls it off the event loop, e.g. in a worker thread, every ``period``) and keeps
    the listed attributes; :meth:`dynamic` returns that snapshot. ``collector`` defaults to
    ``htcondor2.Collector(pool)``; tests pass an object with the same ``query`` method that
    serves recorded ``condor_status -long`` ads. Not run against a live startd here.
    """

    #: attributes a startd updates while it runs (HTCondor manual, "Machine ClassAd
    #: Attributes"); everything else of its ad is static and belongs in the static layer
    DEFAULT_ATTRS = (
        "State",
        "Activity",
        "LoadAvg",
        "CondorLoadAvg",
        "Memory",
        "Disk",
        "KeyboardIdle",
        "Cpus",
        "TotalLoadAvg",
    )

    def __init__(
        self,
        name: str,
        *,
        pool: str | None = None,
        collector: Any = None,
        attrs: Sequence[str] = DEFAULT_ATTRS,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self.name = name
        self.pool = pool
        self._collector = collector
        self.attrs = tuple(attrs)
        self.on_error = on_error
        self._snapshot: dict[str, Any] = {}
        self.refreshes = 0
        self.failures = 0

    def _get_collector(self) -> Any:
        if self._collector is None:
            import importlib

            htcondor2 = importlib.import_module("htcondor2")
            self._collector = htcondor2.Collector(self.pool) if self.pool else htcondor2.Collector()
        return self._collector

    def refresh(self) -> bool:
        """Read the startd ad now (blocking). False (and the old snapshot kept) on failure."""
        try:
            coll = self._get_collector()
            import importlib

            ad_type: Any = "Startd"
            with contextlib.suppress(Exception):  # a fake collector in tests takes the string
                ad_type = importlib.import_module("htcondor2").AdType.Startd
            name = self.name.replace("\\", "\\\\").replace('"', '\\"')
            ads = coll.query(ad_type, constraint=f'Name == "{name}"', projection=list(self.attrs))
            ads = list(ads)
            if not ads:
                raise MachineAdError(f"no startd ad named {self.name!r}")
            ad = ads[0]
            self._snapshot = {k: ad.get(k) for k in self.attrs if k in ad}
            self.refreshes += 1
            return True
        except Exception as exc:
            self.failures += 1
            if self.on_error is not None:
                self.on_error(exc)
            return False

    def dynamic(self) -> Mapping[str, Any]:
        """The attributes read at the last successful refresh (empty before the first)."""
        return self._snapshot
