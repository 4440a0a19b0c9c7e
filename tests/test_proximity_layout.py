"""The columnar peer table of ``overlay.proximity`` against a plain object-per-peer model.

The oracle is the straightforward layout (one record per peer in an insertion-ordered dict, the
RFC 6298 updates written out): after every step of a random sequence of samples, messages,
suspicions, DEAD verdicts, forgets and sweeps — enough forgets to make the table compact its
columns and reuse rows — every query and the iteration order must agree with it.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from overlay import NodeHandle, NodeId
from overlay.proximity import Liveness, Proximity, ProximityConfig
from overlay.runtime import ManualRuntime

ME = NodeHandle(NodeId(1), "me")


class Model:
    """One dict of per-peer records, updated as RFC 6298 and the liveness machine say."""

    def __init__(self, cfg: ProximityConfig) -> None:
        self.cfg = cfg
        self.peers: dict[NodeHandle, dict[str, Any]] = {}
        self.samples: list[float] = []  # every RTT sample taken, for a never-sampled peer's RTO

    def unmeasured_rto(self) -> float:
        c = self.cfg
        if not c.network_rto_samples or len(self.samples) < c.network_rto_samples:
            return c.initial_rto_s
        return min(c.initial_rto_s, max(c.min_rto_s, 3 * max(self.samples)))

    def peer(self, h: NodeHandle) -> dict[str, Any]:
        if h not in self.peers:
            self.peers[h] = dict(
                srtt=None, rttvar=0.0, rto=self.cfg.initial_rto_s, min_rtt=None,
                state=Liveness.UNKNOWN, last_heard=-1.0, dead_since=-1.0,
            )  # fmt: skip
        return self.peers[h]

    def alive(self, h: NodeHandle, now: float) -> None:
        p = self.peers[h]
        p["last_heard"] = now
        p["state"] = Liveness.ALIVE

    def sample(self, h: NodeHandle, r: float, now: float) -> None:
        p, c = self.peer(h), self.cfg
        if p["srtt"] is None:
            p["srtt"], p["rttvar"] = r, r / 2
        else:
            p["rttvar"] = (1 - c.beta) * p["rttvar"] + c.beta * abs(p["srtt"] - r)
            p["srtt"] = (1 - c.alpha) * p["srtt"] + c.alpha * r
        p["rto"] = min(c.max_rto_s, max(c.min_rto_s, p["srtt"] + 4 * p["rttvar"]))
        if p["min_rtt"] is None or r < p["min_rtt"]:
            p["min_rtt"] = r
        self.samples.append(r)
        self.alive(h, now)


def check(prox: Proximity, model: Model, now: float) -> None:
    assert list(prox.peers) == list(model.peers)  # same peers, same (insertion) order
    assert len(prox.peers) == len(model.peers)
    for h, p in prox.peers.items():
        m = model.peers[h]
        assert (p.srtt, p.rttvar, p.rto, p.min_rtt) == (
            m["srtt"],
            m["rttvar"],
            m["rto"],
            m["min_rtt"],
        )
        assert (p.state, p.last_heard, p.dead_since) == (
            m["state"],
            m["last_heard"],
            m["dead_since"],
        )
        assert prox.state(h) is m["state"] and prox.rtt(h) == m["min_rtt"]
        rto = m["rto"] if m["srtt"] is not None else model.unmeasured_rto()
        assert prox.srtt(h) == m["srtt"] and prox.rto(h) == rto
        dead = m["state"] is Liveness.DEAD and now - m["dead_since"] <= model.cfg.dead_memory_s
        assert prox.is_dead(h) is dead
        assert (h in prox.bad) is (m["state"] in (Liveness.SUSPECTED, Liveness.DEAD))
    assert prox.liveness_table() == {h: m["state"] for h, m in model.peers.items()}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_table_matches_object_model(seed: int) -> None:
    rng = random.Random(seed)
    rt = ManualRuntime(seed=seed)
    cfg = ProximityConfig(dead_memory_s=50.0, forget_unreferenced_s=30.0)
    prox = Proximity(rt, ME, cfg, on_dead=lambda h: None)
    model = Model(cfg)
    hs = [NodeHandle(NodeId(i + 2), f"p{i}") for i in range(60)]
    compacted = 0
    for _ in range(3000):
        rt.advance(rng.random())
        now = rt.now()
        h = rng.choice(hs)
        op = rng.random()
        cols = prox.peers.cols
        if op < 0.35:
            r = rng.choice([0.0, rng.random() / 10, rng.random()])
            prox.sample(h, r)
            model.sample(h, r, now)
        elif op < 0.55:
            prox.heard(h)
            if h in model.peers:
                model.alive(h, now)
        elif op < 0.62:
            prox.declare_dead(h)
            p = model.peer(h)
            if p["state"] is not Liveness.DEAD:
                p["state"], p["dead_since"] = Liveness.DEAD, now
        elif op < 0.85:
            prox.forget(h)
            if h in model.peers and model.peers[h]["state"] is not Liveness.DEAD:
                del model.peers[h]
        elif op < 0.95:
            prox.expire_dead()
            for g in [g for g, m in model.peers.items() if m["state"] is Liveness.DEAD]:
                if now - model.peers[g]["dead_since"] > cfg.dead_memory_s:
                    del model.peers[g]
        else:
            # nothing referenced: every live peer unreferenced for 30 s goes
            before = set(prox.peers)
            prox.forget_unreferenced(frozenset())
            for g in before - set(prox.peers):
                del model.peers[g]
        compacted += prox.peers.cols is not cols
        check(prox, model, now)
    assert compacted > 0  # the columns were rebuilt at least once, and nothing moved


def test_negative_and_nan_samples_are_refused() -> None:
    rt = ManualRuntime(seed=1)
    prox = Proximity(rt, ME, ProximityConfig(), on_dead=lambda h: None)
    h = NodeHandle(NodeId(5), "x")
    prox.sample(h, -1.0)
    prox.sample(h, float("nan"))
    assert h not in prox.peers and prox.rtt(h) is None
    prox.sample(h, 0.25)
    assert prox.rtt(h) == 0.25 and prox.peers[h].state is Liveness.ALIVE
