"""Per-lookup event logs for ``flockring bench churn --trace-lookups FILE`` (diagnosis only).

Theory of operation: the churn bench classifies each incorrect or lost lookup by the state of
one node at the end (``incorrect_causes``); finding the *mechanism* needs the lookup's whole
course. The tracer wraps the simulated network's send (so it costs nothing unless asked for)
and logs, per measured lookup, every RouteMsg, RouteAck and custody notice (HandedOff) sent for
it — time, sender, receiver, hop count, whether the datagram was lost, whether the receiver was
alive — and its deliveries. Nodes are named by their index and by their rank by ring distance
to the key among the active nodes at that moment (rank 0 = the root the oracle names). When a
lookup turns out incorrect or lost, the delivering (or last holding) node's view of the root is
added, and its events are written to the file as one JSON line when the lookup's timeout passes
(so copies delivered late are in the log too).
"""

from __future__ import annotations

import json
from typing import Any

from overlay.ids import ring_distance
from overlay.kbr import HandedOff, KbrCore, RouteAck, RouteMsg
from overlay.messages import Message
from sim_adapter.network import Network, SimNode

#: a lookup's retry carries ``lid + k * TRY_STRIDE`` for its try index ``k`` (0 = the first
#: try, whose payload is the lookup id itself): one int, so every try is traced as its lookup
TRY_STRIDE = 1 << 40

__all__ = ["LookupTracer"]


class LookupTracer:
    """Logs the RouteMsg/RouteAck traffic of every measured lookup; writes the failed ones."""

    def __init__(self, run: Any, path: str) -> None:
        # ``run`` is the churn bench's run state (``recs``, ``active``, ``active_since``,
        # ``net``, ``depart``); typed loosely so that this module does not import the bench
        self.run = run
        self.net: Network = run.net
        self.events: dict[int, list[list[Any]]] = {}
        self.mid_lid: dict[int, int] = {}
        self.lid_mid: dict[int, int] = {}
        self.labels: dict[int, dict[str, Any]] = {}
        self.out = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in finish()
        self.written = 0
        orig = self.net._send

        def send(src: int, dst: Any, msg: Message) -> None:
            lid = self._lid(msg)
            if lid is None:
                orig(src, dst, msg)
                return
            lost0 = self.net.dropped_loss
            orig(src, dst, msg)
            self._log(lid, src, dst, msg, self.net.dropped_loss != lost0)

        self.net._send = send
        #: when each node crashed (the bench's departures), for the paths of failed lookups
        self.crashed_at: dict[int, float] = {}
        depart = run.depart

        def traced_depart(node: SimNode) -> None:
            if node.alive:
                self.crashed_at[node.index] = round(self.net.now, 4)
            depart(node)

        run.depart = traced_depart
        self._patch_engine()

    def _patch_engine(self) -> None:
        """Log the routing engine's decisions for traced lookups (class-level wrappers of
        ``KbrCore._step`` and ``KbrCore._hop_timeout``, removed again by :meth:`finish`)."""
        tracer = self
        step0 = KbrCore._step
        timeout0 = KbrCore._hop_timeout
        #: what KbrCore itself defined under each wrapped name (None: inherited)
        self._own = {n: vars(KbrCore).get(n) for n in ("_step", "_hop_timeout")}

        def step(core: KbrCore, msg: RouteMsg, exclude: Any, *a: Any, **kw: Any) -> None:
            lid = tracer._route_lid(msg)
            if lid is None:
                step0(core, msg, exclude, *a, **kw)
                return
            ex = sorted(tracer._rank(lid, tracer._idx(h)) for h in exclude or ())
            bad = sorted(tracer._rank(lid, tracer._idx(h)) for h in core.prox.bad)[:6]
            d0 = core.stats["delivered"]
            step0(core, msg, exclude, *a, **kw)
            hop = core._pending.get(msg.msg_id)
            res = (
                "delivered"
                if core.stats["delivered"] != d0
                else (f"pending->{tracer._idx(hop.nh)}" if hop is not None else "sent/none")
            )
            tracer.note(lid, "step", tracer._idx(core.handle), msg.hops, ex, bad, res)

        def hop_timeout(core: KbrCore, mid: int, hop: Any) -> None:
            lid = tracer.mid_lid.get(mid)
            if lid is not None:
                live = core._pending.get(mid) is hop and not core.stopped
                st = str(core.prox.state(hop.nh)).split(".")[-1]
                tracer.note(
                    lid,
                    "timeout",
                    tracer._idx(core.handle),
                    tracer._idx(hop.nh),
                    hop.attempt,
                    st,
                    live,
                )
            timeout0(core, mid, hop)

        KbrCore._step = step  # type: ignore[method-assign,assignment]
        KbrCore._hop_timeout = hop_timeout  # type: ignore[method-assign,assignment]

    def _route_lid(self, msg: RouteMsg) -> int | None:
        p = msg.payload
        if type(p) is not int:
            return None
        p %= TRY_STRIDE
        return p if p in self.run.recs else None

    def note(self, lid: int, *what: Any) -> None:
        """Add one engine event to lookup ``lid``'s log."""
        ev = self.events.get(lid)
        if ev is None:
            ev = self.events[lid] = []
        ev.append([round(self.net.now, 4), *what])

    def _lid(self, msg: Message) -> int | None:
        if type(msg) is RouteMsg:
            p = self._route_lid(msg)
            if p is not None:
                self.mid_lid[msg.msg_id] = p
                self.lid_mid[p] = msg.msg_id
                return p
            return None
        if type(msg) is RouteAck or type(msg) is HandedOff:
            return self.mid_lid.get(msg.msg_id)
        return None

    def _rank(self, lid: int, idx: int) -> int:
        rec = self.run.recs.get(lid)
        if rec is None or not 0 <= idx < len(self.net.nodes):
            return -1
        key = rec.key
        mine = ring_distance(self.net.nodes[idx].id, key)
        return sum(1 for n in self.run.active if ring_distance(n.id, key) < mine)

    def _log(self, lid: int, src: int, dst: Any, msg: Message, lost: bool) -> None:
        ev = self.events.setdefault(lid, [])
        net = self.net
        d = dst if isinstance(dst, int) else -1
        alive = 0 <= d < len(net.nodes) and net.nodes[d].alive
        t = round(net.now, 4)
        if type(msg) is RouteMsg:
            ev.append(
                [t, "msg", src, self._rank(lid, src), d, self._rank(lid, d), msg.hops, lost, alive]
            )
        else:
            kind = "ack" if type(msg) is RouteAck else "handed_off"  # custody notice
            ev.append([t, kind, src, d, lost, alive])

    def delivered(self, lid: int, at: SimNode) -> None:
        """Lookup ``lid`` was delivered at ``at`` (first or later copy)."""
        ev = self.events.get(lid)
        if ev is not None:
            ev.append([round(self.net.now, 4), "deliver", at.index, self._rank(lid, at.index)])

    def failed(self, lid: int, label: str, at: SimNode | None, root: SimNode | None) -> None:
        """Lookup ``lid`` ended badly (``label``): note the node's view of the root now."""
        info: dict[str, Any] = {"label": label, "t": round(self.net.now, 4)}
        rec = self.run.recs.get(lid)
        if rec is not None:
            info["src"] = rec.src.index
            info["t0"] = round(rec.t0, 4)
        if at is not None:
            core = at.core
            info["at"] = at.index
            info["at_alive"] = at.alive
            info["at_ready"] = core.ready
            info["at_rank"] = self._rank(lid, at.index)
            info["at_stats"] = {
                k: v
                for k, v in core.stats.items()
                if k.startswith("route_") or k in ("reroutes", "bounced_unready")
            }
            if root is not None:
                rh = root.core.handle
                info["root"] = root.index
                info["root_active_for_s"] = round(
                    self.net.now - self.run.active_since.get(root.index, self.net.now), 3
                )
                info["root_state_at_at"] = str(core.prox.state(rh))
                info["root_known_by_at"] = rh in set(core.known_nodes())
                info["root_in_leaf"] = rh in getattr(getattr(core, "leaf", None), "members", ())
            seen = core._seen
            mid = self.lid_mid.get(lid)
            if seen is not None and rec is not None and mid is not None:
                got = seen.get((rec.src.id, mid))
                if got is not None:
                    info["seen_at_at"] = [x if isinstance(x, int) else self._idx(x) for x in got]
        self.labels[lid] = info

    def _idx(self, h: Any) -> int:
        addr = getattr(h, "address", -1)
        return addr if isinstance(addr, int) else -1

    def close(self, lid: int) -> None:
        """The lookup's timeout passed: write its log if it failed, forget it either way."""
        ev = self.events.pop(lid, [])
        info = self.labels.pop(lid, None)
        if info is not None:  # which nodes on its path are still alive now
            nodes = self.net.nodes
            path = {e[2] for e in ev if e[1] in ("msg", "step", "timeout", "deliver")}
            info["path_alive_now"] = {
                i: nodes[i].alive for i in sorted(path) if isinstance(i, int) and i >= 0
            }
            info["path_crashed_at"] = {
                i: self.crashed_at[i] for i in sorted(path) if i in self.crashed_at
            }
        mid = self.lid_mid.pop(lid, None)
        if mid is not None:
            self.mid_lid.pop(mid, None)
        if info is None:
            return
        info["lid"] = lid
        info["events"] = ev
        self.out.write(json.dumps(info) + "\n")
        self.written += 1

    def finish(self) -> None:
        """Write what is still open and close the file."""
        for lid in list(self.labels):
            self.close(lid)
        for name, own in self._own.items():
            if own is None:
                delattr(KbrCore, name)  # inherited (the hop mixin's): drop the wrapper
            else:
                setattr(KbrCore, name, own)
        self.out.close()
