"""The failover roles as a state machine written as data (Butt et al. 2006 §4.2, Fig. 4).

Theory of operation: a node's faultD is always in one :class:`Role`. Things that happen to it
are :class:`Event` values; :data:`TRANSITIONS` maps ``(role, event)`` to the next role and the
:class:`Action` the node performs on the way, with the reason (and source) of the rule. Pairs
in :data:`IGNORED` leave the role unchanged on purpose; any other pair is a protocol bug or
hostile input and is dropped and counted by :class:`~discovery.failover.Failover`. A test checks
that every ``(role, event)`` pair is in exactly one of the two tables.

The paper's Fig. 4 has two roles, Listener and Manager, with three edges: a Listener that
receives ``manager_missing`` becomes the Manager; the original manager returning hears the
replacement's ``alive`` and sends ``preempt_replacement``; the replacement hands its state over
and becomes a Listener. The intermediate roles make the implicit cases safe:

* ``CANDIDATE`` — a takeover is first an election among the replica holders (quorum), so two
  replicas that both believe they are closest to the dead manager during churn cannot both win
  the same term; the loser returns to ``LISTENER`` (refused, or it hears the winner's alive).
* ``TAKING_OVER`` — the winner commits the recovered state to its own replica holders before it
  serves, so a crash in the middle of a takeover loses no committed state.
* ``PREEMPTING`` / ``HANDING_OFF`` — the original's return is a consented election; until the
  original's first alive, the replacement keeps serving (it resumes if the original vanishes).
* A manager partitioned away keeps serving its side; after healing it hears an alive with a
  higher epoch (or a holder refuses its state with a newer promise) and steps down.
* An original that returns while a takeover is in flight waits for the winner's alive and then
  preempts it; if it starts its own election meanwhile, the holders' promises order the two.
"""

from __future__ import annotations

import enum

import attrs

__all__ = [
    "IGNORED",
    "MANAGER_ROLES",
    "TRANSITIONS",
    "Action",
    "Event",
    "Role",
    "Transition",
    "allowed",
    "step",
]


class Role(enum.Enum):
    """What faultD is doing on this node."""

    LISTENER = "listener"  #: follows the manager's alives (Butt Fig. 4)
    CANDIDATE = "candidate"  #: asking the replica holders for votes
    TAKING_OVER = "taking_over"  #: won; committing the recovered state before serving
    MANAGER = "manager"  #: serves the pool, multicasts alives, replicates (Butt Fig. 4)
    PREEMPTING = "preempting"  #: the returned original asked the replacement to hand over
    HANDING_OFF = "handing_off"  #: a manager that consented to a preemption, still serving
    STOPPED = "stopped"  #: the node stopped (crash or shutdown)


#: roles in which a node serves as the pool's manager (alives, commits)
MANAGER_ROLES = frozenset({Role.MANAGER, Role.HANDING_OFF})


class Event(enum.Enum):
    """What can happen to a node's faultD."""

    STARTUP_QUIET = "startup_quiet"  #: original: no alive heard during the start-up wait
    ALIVE_MISSED = "alive_missed"  #: the known manager's alives stopped
    ALIVE_HEARD = "alive_heard"  #: a newer alive from the known manager (same epoch)
    HIGHER_ALIVE = "higher_alive"  #: an alive with a higher epoch than this node's own/known
    LOWER_ALIVE = "lower_alive"  #: an alive with a lower epoch from some other node
    OTHER_MANAGER_HEARD = "other_manager_heard"  #: original: a replacement is serving
    MISSING_RECEIVED = "missing_received"  #: manager_missing was delivered here
    VOTES_QUORUM = "votes_quorum"
    VOTES_FAILED = "votes_failed"
    COMMIT_QUORUM = "commit_quorum"  #: the recovered state is committed at the new holders
    COMMIT_FAILED = "commit_failed"
    SUPERSEDED = "superseded"  #: a holder refused our state: it promised a newer epoch
    PREEMPT_RECEIVED = "preempt_received"  #: a valid preempt_replacement from the original
    HANDOFF_RECEIVED = "handoff_received"  #: the replacement's consent and state arrived
    PREEMPT_TIMEOUT = "preempt_timeout"
    HANDOFF_TIMEOUT = "handoff_timeout"  #: the original never took over
    STOP = "stop"


class Action(enum.Enum):
    """What a node does while taking a transition."""

    NONE = "none"
    START_BOOTSTRAP = "start_bootstrap"
    START_TAKEOVER = "start_takeover"
    START_PREEMPT_ELECTION = "start_preempt_election"
    REPORT_MISSING = "report_missing"
    FOLLOW = "follow"
    REFRESH = "refresh"
    TELL_STALE = "tell_stale"
    ANSWER_ALIVE = "answer_alive"
    COMMIT_RECOVERED = "commit_recovered"
    BEGIN_SERVING = "begin_serving"
    ABANDON = "abandon"
    ABANDON_AND_FOLLOW = "abandon_and_follow"
    STEP_DOWN = "step_down"
    SEND_PREEMPT = "send_preempt"
    RETARGET_PREEMPT = "retarget_preempt"
    SEND_HANDOFF = "send_handoff"
    RESUME = "resume"
    HALT = "halt"


@attrs.frozen(slots=True)
class Transition:
    """One edge of the machine: the next role, the action on the way, and why."""

    target: Role
    action: Action
    why: str


L, C, T, M = Role.LISTENER, Role.CANDIDATE, Role.TAKING_OVER, Role.MANAGER
P, H, S = Role.PREEMPTING, Role.HANDING_OFF, Role.STOPPED
E, A = Event, Action

#: every meaningful ``(role, event)`` pair
TRANSITIONS: dict[tuple[Role, Event], Transition] = {
    # ---- Listener (Butt et al. 2006 §4.2, Fig. 4)
    (L, E.STARTUP_QUIET): Transition(C, A.START_BOOTSTRAP, "original with no manager: claim"),
    (L, E.ALIVE_MISSED): Transition(L, A.REPORT_MISSING, "Butt §4.2: route manager_missing"),
    (L, E.ALIVE_HEARD): Transition(L, A.REFRESH, "known manager alive: reset the timer"),
    (L, E.HIGHER_ALIVE): Transition(L, A.FOLLOW, "Butt §4.2: a new manager: use it"),
    (L, E.LOWER_ALIVE): Transition(L, A.TELL_STALE, "a stale manager: send it the newest alive"),
    (L, E.OTHER_MANAGER_HEARD): Transition(P, A.SEND_PREEMPT, "Butt §4.2: preempt_replacement"),
    (L, E.MISSING_RECEIVED): Transition(C, A.START_TAKEOVER, "Butt §4.2: closest node takes over"),
    # ---- Candidate (the election that makes the takeover unique per term)
    (C, E.VOTES_QUORUM): Transition(T, A.COMMIT_RECOVERED, "won: commit the newest state"),
    (C, E.VOTES_FAILED): Transition(L, A.ABANDON, "refused or no quorum in time"),
    (C, E.HIGHER_ALIVE): Transition(L, A.ABANDON_AND_FOLLOW, "another replica won"),
    (C, E.STOP): Transition(S, A.HALT, "stopped"),
    # ---- Taking over
    (T, E.COMMIT_QUORUM): Transition(M, A.BEGIN_SERVING, "state committed: serve"),
    (T, E.COMMIT_FAILED): Transition(L, A.ABANDON, "holders did not acknowledge in time"),
    (T, E.SUPERSEDED): Transition(L, A.ABANDON, "a newer epoch was promised"),
    (T, E.HIGHER_ALIVE): Transition(L, A.ABANDON_AND_FOLLOW, "a newer manager serves"),
    (T, E.STOP): Transition(S, A.HALT, "stopped"),
    # ---- Manager (Butt et al. 2006 §4.2)
    (M, E.MISSING_RECEIVED): Transition(M, A.ANSWER_ALIVE, "Butt §4.2: alive: ignore it"),
    (M, E.HIGHER_ALIVE): Transition(L, A.STEP_DOWN, "a higher epoch serves: step down"),
    (M, E.LOWER_ALIVE): Transition(M, A.TELL_STALE, "a stale manager: make it step down"),
    (M, E.SUPERSEDED): Transition(L, A.STEP_DOWN, "holders promised a newer epoch"),
    (M, E.PREEMPT_RECEIVED): Transition(H, A.SEND_HANDOFF, "Butt §4.2: transfer the state"),
    (M, E.STOP): Transition(S, A.HALT, "stopped"),
    # ---- Handing off (the replacement that consented to a preemption)
    (H, E.PREEMPT_RECEIVED): Transition(H, A.SEND_HANDOFF, "retransmitted preempt: resend"),
    (H, E.HIGHER_ALIVE): Transition(L, A.STEP_DOWN, "Butt §4.2: becomes a Listener"),
    (H, E.SUPERSEDED): Transition(L, A.STEP_DOWN, "holders promised the original's epoch"),
    (H, E.HANDOFF_TIMEOUT): Transition(M, A.RESUME, "the original never took over"),
    (H, E.MISSING_RECEIVED): Transition(H, A.ANSWER_ALIVE, "still serving: ignore it"),
    (H, E.LOWER_ALIVE): Transition(H, A.TELL_STALE, "a stale manager: make it step down"),
    (H, E.STOP): Transition(S, A.HALT, "stopped"),
    # ---- Preempting (the returned original)
    (P, E.HANDOFF_RECEIVED): Transition(C, A.START_PREEMPT_ELECTION, "consented: elect"),
    (P, E.PREEMPT_TIMEOUT): Transition(L, A.ABANDON, "no handoff: retry on the next alive"),
    (P, E.HIGHER_ALIVE): Transition(P, A.RETARGET_PREEMPT, "a newer replacement: preempt it"),
    (P, E.ALIVE_MISSED): Transition(L, A.REPORT_MISSING, "the replacement vanished"),
    (P, E.MISSING_RECEIVED): Transition(C, A.START_TAKEOVER, "the replacement is gone: take over"),
    (P, E.STOP): Transition(S, A.HALT, "stopped"),
    (L, E.STOP): Transition(S, A.HALT, "stopped"),
}

#: pairs that leave the role unchanged on purpose (and why)
IGNORED: dict[tuple[Role, Event], str] = {
    (L, E.VOTES_QUORUM): "late election result after abandoning",
    (L, E.VOTES_FAILED): "late election result after abandoning",
    (L, E.COMMIT_QUORUM): "late commit result after abandoning",
    (L, E.COMMIT_FAILED): "late commit result after abandoning",
    (L, E.SUPERSEDED): "not serving: nothing to give up",
    (L, E.PREEMPT_RECEIVED): "not serving: the original retries on the next alive",
    (L, E.HANDOFF_RECEIVED): "no preemption in flight",
    (L, E.PREEMPT_TIMEOUT): "no preemption in flight",
    (L, E.HANDOFF_TIMEOUT): "not handing off",
    (C, E.STARTUP_QUIET): "already claiming",
    (C, E.ALIVE_MISSED): "already taking over",
    (C, E.ALIVE_HEARD): "the old manager spoke: the holders' leases refuse the election",
    (C, E.LOWER_ALIVE): "older than the epoch being claimed",
    (C, E.OTHER_MANAGER_HEARD): "decided after the election",
    (C, E.MISSING_RECEIVED): "already taking over",
    (C, E.COMMIT_QUORUM): "not committing",
    (C, E.COMMIT_FAILED): "not committing",
    (C, E.SUPERSEDED): "the election result decides",
    (C, E.PREEMPT_RECEIVED): "not serving",
    (C, E.HANDOFF_RECEIVED): "already electing",
    (C, E.PREEMPT_TIMEOUT): "already electing",
    (C, E.HANDOFF_TIMEOUT): "not handing off",
    (T, E.STARTUP_QUIET): "already claiming",
    (T, E.ALIVE_MISSED): "already taking over",
    (T, E.ALIVE_HEARD): "older than the epoch being committed",
    (T, E.LOWER_ALIVE): "older than the epoch being committed",
    (T, E.OTHER_MANAGER_HEARD): "decided after the takeover",
    (T, E.MISSING_RECEIVED): "already taking over",
    (T, E.VOTES_QUORUM): "late vote",
    (T, E.VOTES_FAILED): "late vote",
    (T, E.PREEMPT_RECEIVED): "not serving yet: the original retries",
    (T, E.HANDOFF_RECEIVED): "not preempting",
    (T, E.PREEMPT_TIMEOUT): "not preempting",
    (T, E.HANDOFF_TIMEOUT): "not handing off",
    (M, E.STARTUP_QUIET): "already serving",
    (M, E.ALIVE_MISSED): "a manager does not watch itself",
    (M, E.ALIVE_HEARD): "own epoch",
    (M, E.OTHER_MANAGER_HEARD): "decided by epochs (HIGHER/LOWER_ALIVE)",
    (M, E.VOTES_QUORUM): "late vote",
    (M, E.VOTES_FAILED): "late vote",
    (M, E.COMMIT_QUORUM): "late commit result",
    (M, E.COMMIT_FAILED): "late commit result",
    (M, E.HANDOFF_RECEIVED): "not preempting",
    (M, E.PREEMPT_TIMEOUT): "not preempting",
    (M, E.HANDOFF_TIMEOUT): "not handing off",
    (H, E.STARTUP_QUIET): "already serving",
    (H, E.ALIVE_MISSED): "a manager does not watch itself",
    (H, E.ALIVE_HEARD): "own epoch",
    (H, E.OTHER_MANAGER_HEARD): "decided by epochs",
    (H, E.VOTES_QUORUM): "late vote",
    (H, E.VOTES_FAILED): "late vote",
    (H, E.COMMIT_QUORUM): "late commit result",
    (H, E.COMMIT_FAILED): "late commit result",
    (H, E.HANDOFF_RECEIVED): "not preempting",
    (H, E.PREEMPT_TIMEOUT): "not preempting",
    (P, E.STARTUP_QUIET): "already acting on a manager",
    (P, E.ALIVE_HEARD): "the manager being preempted is alive: keep asking",
    (P, E.LOWER_ALIVE): "older than the manager being preempted",
    (P, E.OTHER_MANAGER_HEARD): "already preempting",
    (P, E.VOTES_QUORUM): "late vote",
    (P, E.VOTES_FAILED): "late vote",
    (P, E.COMMIT_QUORUM): "late commit result",
    (P, E.COMMIT_FAILED): "late commit result",
    (P, E.SUPERSEDED): "not serving",
    (P, E.PREEMPT_RECEIVED): "not serving",
    (P, E.HANDOFF_TIMEOUT): "not handing off",
    (S, E.STOP): "already stopped",
}
# a stopped node ignores everything
for _ev in Event:
    IGNORED.setdefault((S, _ev), "stopped")
del _ev


def step(role: Role, event: Event) -> Transition | None:
    """The transition for ``event`` in ``role``; None when it is ignored or not allowed
    (:func:`allowed` tells which)."""
    return TRANSITIONS.get((role, event))


def allowed(role: Role, event: Event) -> bool:
    """True when ``event`` is expected in ``role`` (a transition or a deliberate no-op)."""
    return (role, event) in TRANSITIONS or (role, event) in IGNORED
