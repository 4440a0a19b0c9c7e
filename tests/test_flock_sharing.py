"""Sharing rules of the policy file, each where it is enforced, each with its counter-test.

Every rule is run twice on the same small sans-io mesh: with the rule, and with an allow-all
policy — the second run shows the outcome the rule prevents, so each test fails without it.

* Epema et al. 1996 §3.1: idle-machine threshold; machines idle long enough; one-way
  agreements; per-user rules.
* Butt et al. 2006 §3.2 / §4.1: the sender-side check (a pool announces to a receiver only
  what its policy shares with it); the learned blacklist is in ``test_flock_manager``.
* Thain et al. 2004: quotas per remote pool and user, read by the pool model at claim time
  through ``Policy.quota_for``.
"""

from __future__ import annotations

import pytest
from flock_support import KeyedNode, keyed_node, pump, put_in_table

from discovery.announce import FlockConfig
from discovery.flock_messages import FlockAnnounce
from discovery.policy import Peer, Policy
from overlay import ConfigError
from sim_adapter.plugins.flock import FixedPool

ALLOW_ALL = Policy.allow_all()


class IdlePool(FixedPool):
    """A pool that knows how long its free machines have been idle."""

    idle_since_s: list[float] = []

    def free_machines_idle_for(self, seconds: float) -> int:
        return sum(1 for s in self.idle_since_s if s >= seconds)


def _mesh(
    a_policy: Policy,
    a_pool: FixedPool | None = None,
    others: int = 2,
    ttl: int = 1,
    other_pool: FixedPool | None = None,
) -> tuple[KeyedNode, list[KeyedNode]]:
    """Pool A (node 11) and receivers B, C, … (nodes 12, 13, …), all in each other's tables."""
    cfg = FlockConfig(ttl=ttl)
    a = keyed_node(11, pool=a_pool or FixedPool(20, 10), policy=a_policy, config=cfg)
    rest = [
        keyed_node(12 + i, pool=other_pool or FixedPool(20, 0, idle_jobs=9), config=cfg)
        for i in range(others)
    ]
    nodes = [a, *rest]
    for x in nodes:
        for y in nodes:
            if x is not y:
                put_in_table(x.core, y.handle)
    for x in nodes:
        assert len(x.core.table) == len(nodes) - 1  # no slot collisions
    return a, rest


def _offer_seen(rx: KeyedNode, origin: KeyedNode) -> int | None:
    for e in rx.flock.willing_entries():
        if e.origin.id == origin.handle.id:
            return e.free_machines
    return None


def _round(a: KeyedNode, rest: list[KeyedNode]) -> None:
    a.flock.announce_now()
    pump([a, *rest])


def _peer(k: KeyedNode) -> str:
    return f"id:{int(k.handle.id):040x}"


def test_idle_threshold_offers_nothing_until_exceeded() -> None:
    pol = Policy.loads("[sharing]\nshare_threshold = 5\n")
    for free, seen in ((4, None), (5, None), (6, 6)):
        a, rest = _mesh(pol, FixedPool(20, free))
        _round(a, rest)
        assert _offer_seen(rest[0], a) == seen
    a, rest = _mesh(ALLOW_ALL, FixedPool(20, 4))  # without the rule: 4 machines are offered
    _round(a, rest)
    assert _offer_seen(rest[0], a) == 4


def test_only_machines_idle_long_enough_are_offered() -> None:
    pol = Policy.loads("[sharing]\nmin_idle_s = 600\n")
    pool = IdlePool(20, 10)
    pool.idle_since_s = [5.0, 700.0, 30.0, 601.0, 9000.0, 1.0, 2.0, 3.0, 4.0, 599.0]
    a, rest = _mesh(pol, pool)
    _round(a, rest)
    assert _offer_seen(rest[0], a) == 3
    a, rest = _mesh(ALLOW_ALL, pool)
    _round(a, rest)
    assert _offer_seen(rest[0], a) == 10


def test_min_idle_needs_a_pool_that_counts_idle_time() -> None:
    k = keyed_node(11)
    before = k.flock.policy
    with pytest.raises(ConfigError, match="min_idle_s"):
        k.flock.set_policy(Policy.loads("[sharing]\nmin_idle_s = 60\n"))
    assert k.flock.policy is before  # nothing half-applied


def test_global_cap_on_advertised_machines() -> None:
    a, rest = _mesh(Policy.loads("[sharing]\nmax_machines = 4\n"))
    _round(a, rest)
    assert [_offer_seen(r, a) for r in rest] == [4, 4]


def test_sender_side_check_tailors_offers_per_receiver() -> None:
    """Butt et al. 2006 §3.2: A advertises to each receiver only what it shares with it."""
    a, rest = _mesh(ALLOW_ALL, others=3)
    b, c, d = rest
    pol = Policy.loads(
        f'[accept-flock-from]\ndeny = ["{_peer(c)}"]\n\n'
        f'[[agreement]]\npeers = ["{_peer(b)}"]\nmax_machines = 2\n'
    )
    a.flock.set_policy(pol)
    a.flock.announce_now()
    sent = {dst.id: m for dst, m in a.rt.sent if isinstance(m, FlockAnnounce)}
    assert c.handle.id not in sent  # nothing at all to a pool we do not accept jobs from
    assert (sent[b.handle.id].free_machines, sent[b.handle.id].to) == (2, b.handle.id)
    assert sent[b.handle.id].ttl == 1  # tailored copies are never forwarded
    assert (sent[d.handle.id].free_machines, sent[d.handle.id].to) == (10, None)
    pump([a, *rest])
    assert [_offer_seen(x, a) for x in rest] == [2, None, 10]
    a2, rest2 = _mesh(ALLOW_ALL, others=3)  # without the rules: everyone sees all 10
    _round(a2, rest2)
    assert [_offer_seen(x, a2) for x in rest2] == [10, 10, 10]


def test_a_tailored_offer_is_not_passed_on_by_forwarders() -> None:
    pol_template = '[[agreement]]\npeers = ["{}"]\nmax_machines = 1\n'
    a, rest = _mesh(ALLOW_ALL, ttl=2)
    b, c = rest
    a.flock.set_policy(Policy.loads(pol_template.format(_peer(b))))
    _round(a, rest)
    assert b.flock.stats["forwarded"] == 0  # B got a tailored copy and forwards nothing
    assert c.flock.stats["forwarded"] > 0  # C got the public copy (TTL 2) and forwards it
    assert _offer_seen(b, a) == 1  # the public copy C forwarded does not override it


def test_withdrawal_reaches_a_receiver_whose_offer_ended() -> None:
    a, rest = _mesh(ALLOW_ALL)
    b, c = rest
    _round(a, rest)
    assert _offer_seen(b, a) == 10
    a.flock.set_policy(Policy.loads(f'[accept-flock-from]\ndeny = ["{_peer(b)}"]\n'))
    _round(a, rest)
    assert _offer_seen(b, a) is None and _offer_seen(c, a) == 10


def _flocks_to(x: KeyedNode, y: KeyedNode) -> bool:
    x.flock.set_epoch(x.flock.epoch + 1)
    d = x.flock.decide_now()
    return d.enabled and f"{int(y.handle.id):040x}" in [t.node_id for t in d.targets]


def _two_loaded_free_pools(a_policy: Policy) -> tuple[KeyedNode, KeyedNode]:
    """A and B each with free machines *and* a queue longer than that (both want to flock)."""
    a, [b] = _mesh(
        a_policy, FixedPool(20, 3, idle_jobs=9), others=1, other_pool=FixedPool(20, 3, idle_jobs=9)
    )
    a.flock.announce_now()
    b.flock.announce_now()
    pump([a, b])
    return a, b


def test_one_way_agreement_to_never_flocks_backwards() -> None:
    """A's policy: we flock to B; B does not flock to A (A never offers B anything)."""
    probe = keyed_node(12)
    pol = Policy.loads(f'[[agreement]]\npeers = ["{_peer(probe)}"]\ndirection = "to"\n')
    a, b = _two_loaded_free_pools(pol)
    assert _flocks_to(a, b)
    assert not _flocks_to(b, a)
    assert _offer_seen(b, a) is None
    assert not pol.may_accept_flock_from(Peer.from_handle(b.handle))
    a, b = _two_loaded_free_pools(ALLOW_ALL)  # without the agreement both directions flock
    assert _flocks_to(a, b) and _flocks_to(b, a)


def test_one_way_agreement_from_never_flocks_forwards() -> None:
    """A's policy: B may flock to A; A does not flock to B even though B announces to A."""
    probe = keyed_node(12)
    pol = Policy.loads(f'[[agreement]]\npeers = ["{_peer(probe)}"]\ndirection = "from"\n')
    a, b = _two_loaded_free_pools(pol)
    assert _offer_seen(a, b) == 3  # A knows B is willing ...
    assert not _flocks_to(a, b)  # ... but does not flock there
    assert _flocks_to(b, a)


def test_per_user_rules_at_claim_time() -> None:
    pol = Policy.loads(
        '[[agreement]]\npeers = ["host:*.wisc.edu"]\nusers = ["alice@*", "bob@*"]\n'
        'deny_users = ["bob@evil.wisc.edu"]\n\n'
        '[[user]]\nname = "mallory@*"\nallow = false\n'
    )
    wisc = Peer("ab" * 20, "cm.cs.wisc.edu", "udp://10.0.0.1:9000")
    other = Peer("cd" * 20, "cm.example.org", "udp://10.0.0.2:9000")
    assert pol.admits_user(wisc, "alice@cs.wisc.edu")
    assert pol.admits_user(wisc, "bob@cs.wisc.edu")
    assert not pol.admits_user(wisc, "bob@evil.wisc.edu")  # deny_users
    assert not pol.admits_user(wisc, "carol@cs.wisc.edu")  # not in users
    assert pol.admits_user(other, "carol@example.org")  # no agreement: every user
    assert not pol.admits_user(other, "mallory@example.org")  # [[user]] allow = false
    assert not pol.admits("cm.cs.wisc.edu:9618", "carol@cs.wisc.edu")  # pool named by contact
    assert all(
        ALLOW_ALL.admits_user(p, u)
        for p in (wisc, other)
        for u in ("carol@cs.wisc.edu", "bob@evil.wisc.edu", "mallory@example.org")
    )


def test_quotas_for_claim_time() -> None:
    pol = Policy.loads(
        "[sharing]\nquota = 20\nuser_quota = 5\n\n"
        '[[agreement]]\npeers = ["host:*.wisc.edu"]\nquota = 2\n\n'
        '[[user]]\nname = "alice@*"\nquota = 1\n'
    )
    wisc = Peer("ab" * 20, "cm.cs.wisc.edu", "")
    other = Peer("cd" * 20, "cm.example.org", "")
    assert pol.quota_for(wisc) == 2  # the agreement's quota wins over the default
    assert pol.quota_for(other) == 20
    assert pol.quota_for(wisc, "alice@cs.wisc.edu") == 1
    assert pol.quota_for(other, "bob@cs.wisc.edu") == 5
    assert ALLOW_ALL.quota_for(wisc) is None and ALLOW_ALL.quota_for(wisc, "alice@x") is None
    # the pool model names the origin by collector or node id
    assert pol.quota_for("cm.cs.wisc.edu:9618") == 2 and pol.quota_for("ab" * 20) == 20
    assert pol.quota_for("cm.cs.wisc.edu:9618", "alice@x") == 1
    assert pol.admits("cm.cs.wisc.edu:9618", "alice@x")
