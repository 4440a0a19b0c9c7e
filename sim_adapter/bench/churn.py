"""``flockring bench churn``: routing under continuous churn and loss, measured as MSPastry did.

Theory of operation (Castro, Costa & Rowstron, "Performance and dependability of structured
peer-to-peer overlays", DSN 2004 — MSPastry — §5.1 methodology). A ring of ``--nodes`` N is
built (oracle build by default, so the start is a settled ring), then churn runs for
``--warmup-min`` before anything is measured and for ``--hours`` after:

* **Sessions.** Arrivals are a Poisson process of rate N / S and each node's session is
  exponential with mean S = ``--session-min`` (MSPastry's Poisson model), so N nodes are up on
  average; the first N get exponential residual sessions (memoryless). A session ends in a
  crash (fail-stop, no leave message — the hard case MSPastry measured). ``--trace FILE``
  replaces the model with a file of ``arrive_s depart_s`` lines (one per session; ``#``
  comments), e.g. converted from a Gnutella or OverNet availability trace.
* **Lookups** leave random active nodes (joined, alive) for random keys at
  ``--lookup-rate`` per node per second (MSPastry: 0.01/s). Each one's delivery is checked
  against the oracle at the moment of delivery — the active node numerically closest to the
  key, by brute force (``Network.closest_live``) — so a lookup delivered to a node that has
  since lost responsibility, or before the responsible node finished joining, is incorrect.
* **Every loss has a cause**: a lookup not delivered within ``--lookup-timeout-s`` is lost
  with cause ``source_crashed`` (its source died before its first hop acknowledged it, so no
  other node ever held it), ``holder_crashed`` (a later node that forwarded it died before
  its next hop acknowledged and custody did not save it), or ``dropped`` (the
  holder is alive: retransmissions exhausted, hop limit, or loss). A delivery after the
  timeout is counted as ``late``; a second delivery as ``duplicate``, and as
  ``duplicate_at_root`` too when it came to the node then closest to the key (the root changed
  in between). ``hops_mean`` counts the ``forward`` upcalls of a lookup: with a spare first
  hop (``KbrConfig.spare_first_hop``) those of both copies, the hop work a lookup cost rather
  than the length of the path that delivered it.
* **One-way or request/response.** By default a lookup is routed once and nothing comes back:
  the one-way message MSPastry measured, whose per-hop acks cannot save a lookup whose holder
  crashes. ``--tries K`` (K > 1) measures what a caller of ``overlay.Node.lookup`` gets instead:
  the root answers the source with one direct datagram, and a source that has no answer after
  ``--try-timeout-s`` routes the lookup again, up to K times in all (end-to-end retry,
  Saltzer, Reed & Clark 1984). The first delivery is the one checked against the oracle; the
  answers are lookup traffic, not control, and the report counts the retries and the lookups
  they recovered. A lost lookup whose source died unanswered is ``source_crashed`` here.
* **Tracing** (``--trace-lookups FILE``, off by default: it wraps the network's send): every
  RouteMsg and RouteAck of a measured lookup is logged (time, sender, receiver, hop count,
  whether the datagram was lost), with its delivery and the liveness verdicts of the nodes on
  its path; the events of each incorrect or lost lookup are written to FILE as JSON lines.
* **Control traffic** per window of ``--sample-s``: every message sent minus the lookups' own
  (one RouteMsg and one RouteAck per hop, from the lookup application's ``forward`` upcalls,
  and the custody notices, ``HandedOff``, that name a lookup's message: the network's send is
  wrapped to learn the lookups' message ids), per active node per second. It includes joins
  (their routed messages' notices too), maintenance, repairs, hop retransmits and the probes
  of hops whose notice was late.

A benchmark, never a test: it reports its goals (>= 99.99% correct, no silent loss, control
< 0.5 msg/s/node) and whether they were met.
"""

from __future__ import annotations

import argparse
import math
import random
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from overlay.errors import ConfigError
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.kbr import BaseApplication, HandedOff, RouteMsg
from sim_adapter import bench
from sim_adapter.bench.churn_trace import TRY_STRIDE as _TRY_STRIDE
from sim_adapter.network import Network, SimNode

if TYPE_CHECKING:
    from sim_adapter.bench.churn_trace import LookupTracer

#: the application name the probes use on every node
CHURN_APP = "bench.churn"
#: ``overlay.Node.lookup``'s schedule: three tries within its default 5-s timeout
DEFAULT_TRY_TIMEOUT_S = 5.0 / 3
#: MSPastry's lookup rate per node (Castro et al. 2004 §5.1): 0.01 lookups/s
DEFAULT_LOOKUP_RATE = 0.01
GOAL_CORRECT = 0.9999
GOAL_CONTROL = 0.5
#: a root active for less than this is "young" when an incorrect delivery is classified
_YOUNG_S = 10.0


class _Rec:
    """One lookup in flight."""

    __slots__ = ("answered", "done", "holder", "hops", "key", "src", "t0", "tries", "window")

    def __init__(self, key: NodeId, src: SimNode, t0: float, window: int) -> None:
        self.key = key
        self.src = src
        self.t0 = t0
        self.window = window
        self.hops = 0
        self.holder: SimNode | None = None
        self.done = False
        self.tries = 1
        self.answered = False


class _Probe(BaseApplication):
    """The measuring application on one node: counts hops, notes the holder, checks
    deliveries against the oracle."""

    __slots__ = ("node", "run")

    def __init__(self, run: _ChurnRun, node: SimNode) -> None:
        self.run = run
        self.node = node

    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        """A lookup arrived here: check it against the brute-force oracle now (and answer the
        source, in request/response mode); or an answer came back to the source."""
        if type(payload) is int:
            k, lid = divmod(payload, _TRY_STRIDE)
            self.run.delivered(lid, self.node, k)
            if self.run.args.tries > 1:
                # the answer is a datagram unless the source is its own root
                self.run.answers_in_window += src != self.node.core.handle
                self.node.core.route(None, CHURN_APP, (lid,), hint=src)
        elif type(payload) is tuple:
            self.run.answered(payload[0])

    def forward(self, key: NodeId, payload: Any, next_hop: NodeHandle) -> NodeHandle | None:
        """One more hop, and this node holds the lookup until the next hop acknowledges."""
        rec = self.run.recs.get(payload % _TRY_STRIDE) if type(payload) is int else None
        if rec is not None:
            rec.hops += 1
            rec.holder = self.node
            self.run.hops_in_window += 1
        return next_hop


class _AnsweredProbe(_Probe):
    """The measuring application of request/response runs (``--tries`` > 1)."""

    __slots__ = ()
    end_to_end = True


class _ChurnRun:
    """State of one churn run: the population, the lookups in flight, the counters."""

    def __init__(self, args: argparse.Namespace, net: Network) -> None:
        self.args = args
        self.net = net
        #: the overlay's config with the ``--set`` overrides, given to every node that arrives
        self.config: Any = None
        self.rng = random.Random(net.rng.getrandbits(64))
        self.active: list[SimNode] = []  # joined and alive: lookup sources
        self.pos: dict[int, int] = {}  # node index -> position in active
        self.recs: dict[int, _Rec] = {}
        self.seq = 0
        self.measuring = False
        self.hops_in_window = 0
        self.answers_in_window = 0
        #: custody notices of lookups' messages sent so far, and until the current window began
        #: (lookup traffic, not control; :meth:`count_lookup_notices`)
        self.lookup_notices = 0
        self.notices_mark = 0
        self.lookup_mids: set[int] = set()
        self.c: dict[str, int] = dict.fromkeys(
            (
                "launched",
                "delivered",
                "correct",
                "incorrect",
                "late",
                "duplicate",
                "duplicate_at_root",
                "retries",
                "recovered_by_retry",
                "source_crashed",
                "holder_crashed",
                "dropped",
                "arrivals",
                "departures",
                "failed_joins",
            ),
            0,
        )
        self.hops: list[int] = []
        self.incorrect_causes: Counter[str] = Counter()
        self.by_type: dict[str, float] = {}
        self.node_stats: dict[str, float] = {}
        #: exceptions the cores' message handlers raised outside their input checks while
        #: measured (``KbrCore.receive``: each a bug a message found; the node went on)
        self.handler_errors = 0
        self.active_since: dict[int, float] = {}
        self.rdp: list[float] = []
        self.latency_s: list[float] = []
        self.windows: list[dict[str, Any]] = []
        self.win = {"launched": 0}
        #: correct deliveries and losses by the window their lookup was launched in (a lookup
        #: launched near a window's end is settled in the next: counted where it started)
        self.win_correct: Counter[int] = Counter()
        self.win_lost: Counter[int] = Counter()
        #: per-lookup event log (``--trace-lookups``), None when off
        self.tracer: LookupTracer | None = None

    def count_lookup_notices(self) -> None:
        """Wrap the network's send to count the custody notices that name a lookup's message.

        A ``HandedOff`` names only a message id, so counting by class would also take the
        notices of routed joins out of control traffic: the ids are learnt from the lookups'
        own RouteMsgs as they are sent (the notice always follows its message).
        """
        net = self.net
        orig = net._send
        mids = self.lookup_mids

        def send(src: int, dst: Any, msg: Any) -> None:
            t = type(msg)
            if t is RouteMsg:
                if msg.app == CHURN_APP:
                    mids.add(msg.msg_id)
            elif t is HandedOff and msg.msg_id in mids:
                self.lookup_notices += 1
            orig(src, dst, msg)

        net._send = send  # type: ignore[method-assign]

    # ------------------------------------------------------------------ population
    def attach(self, node: SimNode) -> None:
        # request/response lookups retry end to end, as ``overlay.Node.lookup`` does: like its
        # lookup application, no custody for them
        app = _AnsweredProbe if self.args.tries > 1 else _Probe
        node.core.register(CHURN_APP, app(self, node))

    def activate(self, node: SimNode) -> None:
        if node.alive and node.index not in self.pos:
            self.active_since[node.index] = self.net.now
            self.pos[node.index] = len(self.active)
            self.active.append(node)

    def deactivate(self, node: SimNode) -> None:
        i = self.pos.pop(node.index, None)
        self.active_since.pop(node.index, None)
        if i is None:
            return
        last = self.active.pop()
        if last is not node:
            self.active[i] = last
            self.pos[last.index] = i

    def depart(self, node: SimNode) -> None:
        if not node.alive:
            return
        self.deactivate(node)
        self.net.crash(node)
        self.c["departures"] += self.measuring

    def arrive(self, session_s: float | None) -> None:
        def joined(node: SimNode, ok: bool) -> None:
            if ok:
                self.activate(node)
            else:
                self.c["failed_joins"] += self.measuring

        node = self.net.arrive(config=self.config, on_joined=joined)
        self.attach(node)
        self.c["arrivals"] += self.measuring
        if session_s is not None:
            self.net.engine.push(self.net.now + session_s, self.depart, (node,))

    # ------------------------------------------------------------------ lookups
    def launch(self) -> None:
        if not self.active:
            return
        src = self.active[self.rng.randrange(len(self.active))]
        key = NodeId.random(self.rng)
        self.seq += 1
        lid = self.seq
        now = self.net.now
        # window -1: launched during the warm-up, never counted
        rec = _Rec(key, src, now, len(self.windows) if self.measuring else -1)
        self.recs[lid] = rec
        if self.measuring:
            self.c["launched"] += 1
            self.win["launched"] += 1
        self.net.engine.push(now + self.args.lookup_timeout_s, self.expire, (lid,))
        if self.args.tries > 1:
            self.net.engine.push(now + self.args.try_timeout_s, self.retry, (lid,))
        src.core.route(key, CHURN_APP, lid)

    def retry(self, lid: int) -> None:
        """No answer yet: the source routes the lookup again (a fresh message), as
        ``overlay.Node.lookup`` does, until it has tried ``--tries`` times."""
        rec = self.recs.get(lid)
        if rec is None or rec.answered or not rec.src.alive:
            return
        k = rec.tries
        rec.tries += 1
        self.c["retries"] += rec.window >= 0
        if rec.tries < self.args.tries:
            self.net.engine.push(self.net.now + self.args.try_timeout_s, self.retry, (lid,))
        rec.src.core.route(rec.key, CHURN_APP, lid + k * _TRY_STRIDE)

    def answered(self, lid: int) -> None:
        rec = self.recs.get(lid)
        if rec is not None:
            rec.answered = True

    def delivered(self, lid: int, at: SimNode, k: int = 0) -> None:
        if self.tracer is not None:
            self.tracer.delivered(lid, at)
        rec = self.recs.get(lid)
        if rec is None:  # already expired
            self.c["late"] += self.measuring
            return
        counted = rec.window >= 0
        if rec.done:
            self.c["duplicate"] += counted
            # a second delivery at the node closest to the key when it arrived: the root
            # changed since the first (a copy that came later; a spare first hop's)
            self.c["duplicate_at_root"] += counted and at.id == self.net.closest_live(int(rec.key))
            return
        rec.done = True
        if not counted:
            return
        net = self.net
        self.c["delivered"] += 1
        self.c["recovered_by_retry"] += k > 0
        root = net.closest_live(int(rec.key))
        if at.id == root:
            self.c["correct"] += 1
            self.win_correct[rec.window] += 1
        else:
            self.c["incorrect"] += 1
            cause = self.classify(at, net.node_by_id(int(root)))
            self.incorrect_causes[cause] += 1
            if self.tracer is not None:
                self.tracer.failed(lid, "incorrect:" + cause, at, net.node_by_id(int(root)))
        el = net.now - rec.t0
        self.hops.append(rec.hops)
        self.latency_s.append(el)
        if at is not rec.src:
            direct = net.latency.one_way_s(rec.src.index, at.index)
            if direct > 0:
                self.rdp.append(el / direct)

    def classify(self, at: SimNode, root: SimNode) -> str:
        """Why ``at`` delivered a lookup that belonged to ``root``, from ``at``'s state now.

        ``root_young``: the root became active less than ``_YOUNG_S`` ago and ``at`` does not
        know it yet (a join not yet announced to its neighbours); ``root_unknown``: an older
        root ``at`` does not know (a leaf set not yet repaired); ``root_suspected``: ``at``
        knows it but holds it suspected or dead; ``root_excluded``: ``at`` knows it as live,
        so it was left out by the reroute or loop exclusion of this lookup."""
        core = at.core
        rh = root.core.handle
        if rh in core.prox.bad:
            return "root_suspected"
        leaf = getattr(core, "leaf", None)  # Pastry: known, but only in the routing table?
        if leaf is not None and rh not in leaf.members and rh in set(core.known_nodes()):
            return "root_not_in_leaf_set"
        if rh in set(core.known_nodes()):
            return "root_excluded"
        since = self.active_since.get(root.index)
        if since is not None and self.net.now - since < _YOUNG_S:
            return "root_young"
        return "root_unknown"

    def expire(self, lid: int) -> None:
        rec = self.recs.pop(lid)
        if rec.done or rec.window < 0:
            if self.tracer is not None:
                self.tracer.close(lid)
            return
        if (
            rec.holder is None
            or rec.holder is rec.src
            or (self.args.tries > 1 and not rec.src.alive)
        ):
            # The source holds it (one-way: a source that died before its first hop
            # acknowledged the lookup, so no other node ever held it and no per-hop scheme
            # could have saved it; traced under 5-minute sessions, every small-world loss of
            # seed 3 was one, 0.05-2 s after it sent), or request/response: a source that died
            # unanswered could not retry, whatever the last try's holder did.
            cause = "source_crashed" if not rec.src.alive else "dropped"
        else:
            cause = "holder_crashed" if not rec.holder.alive else "dropped"
        self.c[cause] += 1
        self.win_lost[rec.window] += 1
        if self.tracer is not None:
            self.tracer.failed(lid, "lost:" + cause, rec.holder, None)
            self.tracer.close(lid)

    # ------------------------------------------------------------------ windows
    def sample(self, t_prev: float, m_prev: int) -> tuple[float, int]:
        net = self.net
        now = net.now
        dt = now - t_prev
        live = len(self.active)
        msgs = net.message_count - m_prev
        notices = self.lookup_notices
        control = msgs - 2 * self.hops_in_window - self.answers_in_window
        control -= notices - self.notices_mark
        self.notices_mark = notices
        self.windows.append(
            {
                "t_min": bench.r(now / 60.0, 2),
                "seconds": bench.r(dt, 3),
                "active": live,
                "control_msgs_per_s_per_node": bench.r(control / dt / max(1, live), 4),
                "launched": self.win["launched"],
                "correct": 0,  # filled in by ``settle_windows``
                "lost": 0,
            }
        )
        self.hops_in_window = 0
        self.answers_in_window = 0
        self.win = {"launched": 0}
        return now, net.message_count

    def settle_windows(self) -> None:
        """Give each window the outcomes of the lookups launched in it."""
        for i, w in enumerate(self.windows):
            w["correct"] = self.win_correct[i]
            w["lost"] = self.win_lost[i]


def _read_trace(path: str) -> list[tuple[float, float]]:
    """``arrive_s depart_s`` per line (``#`` comments); a bad line names the file and line."""
    out: list[tuple[float, float]] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--trace {path}: {e.strerror or e}") from None
    for i, line in enumerate(text.splitlines(), start=1):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        parts = body.split()
        try:
            a, d = float(parts[0]), float(parts[1])
        except (IndexError, ValueError):
            raise ConfigError(f"{path}:{i}: expected 'arrive_s depart_s', got {line!r}") from None
        if not (math.isfinite(a) and math.isfinite(d) and 0 <= a < d):
            raise ConfigError(f"{path}:{i}: need 0 <= arrive_s < depart_s, got {line!r}")
        out.append((a, d))
    if not out:
        raise ConfigError(f"{path}: no sessions")
    return sorted(out)


def _node_stats(net: Network) -> Counter[str]:
    """Every node's protocol counters (``core.stats``, crashed nodes included) summed, with the
    probes each proximity table sent (``probes_sent``): what the Ping/Pong share is made of."""
    tot: Counter[str] = Counter()
    for n in net.nodes:
        tot.update(n.core.stats)
        tot["probes_sent"] += n.core.prox.probes_sent
    return tot


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the ring, churn it, measure; return the figures as a dict."""
    from sim_adapter.bench.overlay import make_latency

    if args.nodes < 2 or args.session_min <= 0 or args.hours <= 0 or args.lookup_rate < 0:
        raise ConfigError("need --nodes >= 2, --session-min > 0, --hours > 0, --lookup-rate >= 0")
    if not 1 <= args.tries < 8 or args.try_timeout_s <= 0:
        raise ConfigError("need 1 <= --tries < 8 and --try-timeout-s > 0")
    net = Network(seed=args.seed, latency=make_latency(args.latency, args.seed), loss=args.loss)
    cr = _ChurnRun(args, net)
    cr.count_lookup_notices()
    if getattr(args, "set", None):
        from overlay.pastry import PastryConfig
        from overlay.smallworld import SmallWorldConfig
        from sim_adapter.bench.pastry import _config

        cls = PastryConfig if args.overlay == "pastry" else SmallWorldConfig
        cr.config = _config(args.set, cls)
    rng = cr.rng
    session_s = args.session_min * 60.0
    warm_s = args.warmup_min * 60.0
    end_s = warm_s + args.hours * 3600.0
    trace = _read_trace(args.trace) if args.trace else None
    trace_out = getattr(args, "trace_lookups", None)
    if trace_out:
        from sim_adapter.bench.churn_trace import LookupTracer

        cr.tracer = LookupTracer(cr, trace_out)
    with bench.stopwatch() as wall:
        n0 = args.nodes if trace is None else sum(1 for a, _ in trace if a == 0.0) or 1
        first = net.spawn(n0, overlay=args.overlay, build=args.build, config=cr.config)
        eng = net.engine
        t0 = net.now
        for i, node in enumerate(first):
            cr.attach(node)
            cr.activate(node)
            if trace is None:
                eng.push(t0 + rng.expovariate(1.0 / session_s), cr.depart, (node,))
            elif i < len(trace):
                eng.push(t0 + trace[i][1], cr.depart, (node,))
        if trace is None:
            t = t0
            rate = args.nodes / session_s
            while True:
                t += rng.expovariate(rate)
                if t >= t0 + end_s:
                    break
                eng.push(t, cr.arrive, (rng.expovariate(1.0 / session_s),))
        else:
            for a, d in trace[n0:]:
                if a < end_s:
                    eng.push(t0 + a, cr.arrive, (d - a,))
        if args.lookup_rate > 0:
            t = t0
            rate = args.lookup_rate * args.nodes
            while True:
                t += rng.expovariate(rate)
                if t >= t0 + end_s - args.lookup_timeout_s:
                    break
                eng.push(t, cr.launch, ())
        prog = bench.Progress("churn", args.progress or None)
        net.run(warm_s)
        cr.measuring = True
        tp, mp = net.now, net.message_count
        by_type0 = net.msg_by_type
        stats0 = _node_stats(net)
        cr.hops_in_window = 0
        cr.answers_in_window = 0
        cr.notices_mark = cr.lookup_notices
        steps = max(1, math.ceil(args.hours * 3600.0 / args.sample_s))
        for k in range(steps):
            net.run(min(args.sample_s, t0 + end_s - net.now))
            tp, mp = cr.sample(tp, mp)
            prog(k + 1, steps)
        for lid in list(cr.recs):  # lookups launched too late to time out in the window
            cr.recs.pop(lid)
        cr.settle_windows()
        if cr.tracer is not None:
            cr.tracer.finish()
        # every message sent while measuring, by class, per active node per second (the
        # lookups' own RouteMsg/RouteAck included: the breakdown of the control figure)
        node_s = sum(w["active"] * w["seconds"] for w in cr.windows) or 1.0
        by_type = net.msg_by_type
        by_type.subtract(by_type0)
        cr.by_type = {k: bench.r(v / node_s, 4) for k, v in by_type.most_common() if v > 0}
        st = _node_stats(net)
        st.subtract(stats0)
        cr.handler_errors = st["handler_errors"]
        cr.node_stats = {k: bench.r(v / node_s, 4) for k, v in st.most_common() if v > 0}
    return _report(args, net, cr, wall())


def _report(args: argparse.Namespace, net: Network, cr: _ChurnRun, wall_s: float) -> dict[str, Any]:
    c = cr.c
    launched = c["launched"]
    lost = c["source_crashed"] + c["holder_crashed"] + c["dropped"]
    control = [w["control_msgs_per_s_per_node"] for w in cr.windows]
    correct_frac = c["correct"] / launched if launched else math.nan
    # the mean over the measured node-seconds, not over windows: the last window is usually a
    # short remainder, and an unweighted mean let it count as much as a full one
    node_s = sum(w["active"] * w["seconds"] for w in cr.windows)
    ctrl_mean = (
        sum(w["control_msgs_per_s_per_node"] * w["active"] * w["seconds"] for w in cr.windows)
        / node_s
        if node_s
        else math.nan
    )
    res: dict[str, Any] = {
        "bench": "churn",
        "overlay": args.overlay,
        "nodes": args.nodes,
        "session_min": args.session_min,
        "trace": args.trace,
        "loss": args.loss,
        "latency": args.latency,
        "build": args.build,
        "warmup_min": args.warmup_min,
        "hours": args.hours,
        "lookup_rate_per_node_s": args.lookup_rate,
        "config_overrides": list(getattr(args, "set", None) or ()),
        "tries": args.tries,
        "try_timeout_s": bench.r(args.try_timeout_s, 3) if args.tries > 1 else None,
        "seed": args.seed,
        "active_mean": bench.r(bench.mean([w["active"] for w in cr.windows]), 1),
        **c,
        "lost": lost,
        "incorrect_causes": dict(sorted(cr.incorrect_causes.items())),
        "msgs_per_s_per_node_by_type": cr.by_type,
        "node_stats_per_s_per_node": cr.node_stats,
        "unaccounted": launched - c["delivered"] - lost,
        "handler_errors": cr.handler_errors,
        "correct_fraction": bench.r(correct_frac, 6),
        # the same over the lookups whose source did not die holding them or waiting for the
        # answer: what the overlay itself got right (the goal is judged on correct_fraction)
        "correct_fraction_source_alive": bench.r(
            c["correct"] / (launched - c["source_crashed"])
            if launched > c["source_crashed"]
            else math.nan,
            6,
        ),
        "hops_mean": bench.r(bench.mean(cr.hops), 3),
        "rdp_mean": bench.r(bench.mean(cr.rdp), 3),
        "rdp_p50": bench.r(bench.percentile(cr.rdp, 50), 3),
        "latency_ms_p50": bench.r(bench.percentile(cr.latency_s, 50) * 1e3, 1),
        "latency_ms_p99": bench.r(bench.percentile(cr.latency_s, 99) * 1e3, 1),
        "control_msgs_per_s_per_node_mean": bench.r(ctrl_mean, 4),
        "control_msgs_per_s_per_node_max": bench.r(max(control), 4) if control else None,
        "dropped_loss": net.dropped_loss,
        "dropped_dead": net.dropped_dead,
        # custody notices naming a lookup's message, whole run (the rest are control)
        "lookup_notices": cr.lookup_notices,
        "goal_correct": GOAL_CORRECT,
        "goal_control_msgs_per_s_per_node": GOAL_CONTROL,
        "meets_correct": bool(launched) and correct_frac >= GOAL_CORRECT,
        "meets_control": bool(control) and ctrl_mean < GOAL_CONTROL,
        "events": net.engine.events,
        "wall_s": bench.r(wall_s, 1),
        "peak_rss_mib": bench.r(bench.peak_rss_mib(), 1),
        **bench.environment(),
        "windows": cr.windows,
    }
    if args.png:
        _plot(res, args.png)
    return res


def _plot(res: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ws = res["windows"]
    t = [w["t_min"] for w in ws]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(7.5, 5.5), dpi=110, sharex=True)
    # markers: a run of one window (a short measured span) is one point, which a line omits
    a1.plot(t, [w["control_msgs_per_s_per_node"] for w in ws], marker="o", label="control traffic")
    a1.axhline(GOAL_CONTROL, ls="--", c="grey", label=f"goal {GOAL_CONTROL}")
    a1.set_ylabel("msg/s per node")
    a1.legend()
    frac = [w["correct"] / w["launched"] if w["launched"] else math.nan for w in ws]
    a2.plot(t, frac, marker="o", label="correct fraction")
    a2.set_ylabel("correct lookups")
    a2.set_xlabel("virtual time (min)")
    title = (
        f"{res['overlay']}, N={res['nodes']}, sessions {res['session_min']} min, "
        f"loss {res['loss']:.0%}"
    )
    a1.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _main(args: argparse.Namespace) -> int:
    bench.emit(run(args), args.json, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``churn`` benchmark parser."""
    p = sub.add_parser("churn", help="lookups under continuous churn and loss (MSPastry-style)")
    p.add_argument("--overlay", choices=("pastry", "smallworld"), default="pastry")
    p.add_argument("--nodes", type=int, default=2000, help="mean number of nodes N")
    p.add_argument("--session-min", type=float, default=30.0, help="mean session, minutes")
    p.add_argument("--trace", help="sessions from a file of 'arrive_s depart_s' lines")
    p.add_argument("--loss", type=float, default=0.0, help="message loss rate in [0, 1)")
    p.add_argument("--hours", type=float, default=1.0, help="virtual hours measured")
    p.add_argument("--warmup-min", type=float, default=10.0, help="churn before measuring")
    p.add_argument("--latency", default="transit-stub", help="latency model (bench pastry)")
    p.add_argument("--build", choices=("oracle", "joins"), default="oracle")
    p.add_argument(
        "--lookup-rate", type=float, default=DEFAULT_LOOKUP_RATE, help="lookups/s per node"
    )
    p.add_argument("--lookup-timeout-s", type=float, default=60.0)
    p.add_argument(
        "--tries",
        type=int,
        default=1,
        help="1: one-way lookups (MSPastry); K > 1: the root answers and the source retries, "
        "K tries in all (overlay.Node.lookup: 3)",
    )
    p.add_argument(
        "--try-timeout-s",
        type=float,
        default=DEFAULT_TRY_TIMEOUT_S,
        help="wait for an answer this long before the next try (default: Node.lookup's 5 s / 3)",
    )
    p.add_argument("--sample-s", type=float, default=300.0, help="window of the time series")
    p.add_argument("--png", help="write the time series figure here")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="also write the JSON to this file")
    p.add_argument("--progress", action="store_true", help="progress bar on stderr")
    p.add_argument(
        "--trace-lookups",
        metavar="FILE",
        help="write the hop-by-hop events of every incorrect or lost lookup here (JSON lines)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="override a field of the overlay's config (PastryConfig or SmallWorldConfig; "
        "GROUP.FIELD for a nested one, e.g. kbr.custody=false), repeatable",
    )
    p.set_defaults(func=_main)
