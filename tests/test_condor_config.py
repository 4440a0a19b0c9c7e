"""Rendering HTCondor configuration: exact text, our checker, and HTCondor's own parser.

``parse_with_htcondor`` loads a fragment with the configuration parser of the ``htcondor``
wheel in a child process (no daemon): it is the oracle for "HTCondor reads what we write the
way we mean it" — macro expansion of ``$(FLOCK_TO)``, list order, the guarded ``ALLOW_*`` lines.
"""

from __future__ import annotations

import pytest

from discovery.condor import (
    FlockSource,
    render_condor_host,
    render_execute_config,
    render_flock_config,
    render_submit_config,
)
from discovery.condor_syntax import (
    CondorError,
    is_valid_contact,
    is_valid_host_pattern,
    parse_config,
    parse_with_htcondor,
)
from discovery.decision import FlockDecision, FlockTarget


def target(collector: str, rtt_s: float, row: int = 0) -> FlockTarget:
    return FlockTarget(node_id=f"{row:040x}", collector=collector, rtt_s=rtt_s, row=row)


DECISION = FlockDecision(
    enabled=True,
    targets=(
        target("cm.near.example.org:9618", 0.004),
        target("192.0.2.7", 0.021, 1),
        target("cm.far.example.net:9620", 0.180, 2),
    ),
    at_s=120.0,
    epoch=3,
    seq=17,
)
ADMITTED: list[FlockSource | str] = [
    FlockSource("near", ("submit1.near.example.org", "submit2.near.example.org")),
    FlockSource("campus", ("*.campus.example.edu",)),
    "198.51.100.0/24",
]

EXPECTED = """\
# Written by flockring; rewritten on every flocking decision, do not edit.
# flockring flocking decision epoch=3 seq=17: on, 3 targets nearest first
FLOCK_TO = cm.near.example.org:9618, 192.0.2.7, cm.far.example.net:9620
FLOCK_COLLECTOR_HOSTS = $(FLOCK_TO)
FLOCK_NEGOTIATOR_HOSTS = $(FLOCK_TO)
# flockring: pools admitted to flock here: near, campus, 198.51.100.0/24
FLOCK_FROM = submit1.near.example.org, submit2.near.example.org, *.campus.example.edu, \
198.51.100.0/24
if defined ALLOW_WRITE
ALLOW_WRITE_COLLECTOR = $(ALLOW_WRITE), $(FLOCK_FROM)
ALLOW_WRITE_STARTD = $(ALLOW_WRITE), $(FLOCK_FROM)
endif
if defined ALLOW_READ
ALLOW_READ_COLLECTOR = $(ALLOW_READ), $(FLOCK_FROM)
ALLOW_READ_STARTD = $(ALLOW_READ), $(FLOCK_FROM)
endif
"""

KNOBS = [
    "FLOCK_TO",
    "FLOCK_COLLECTOR_HOSTS",
    "FLOCK_NEGOTIATOR_HOSTS",
    "FLOCK_FROM",
    "ALLOW_WRITE_COLLECTOR",
    "ALLOW_WRITE_STARTD",
    "ALLOW_READ_COLLECTOR",
    "ALLOW_READ_STARTD",
]


def split(v: object) -> list[str]:
    assert v is None or isinstance(v, str)
    return (v or "").replace(",", " ").split()


def test_known_decision_renders_the_expected_text() -> None:
    assert render_flock_config(DECISION, admitted=ADMITTED) == EXPECTED


def test_rendered_fragment_parses_as_configuration() -> None:
    values = parse_config(EXPECTED)
    assert all(v for v in values.values())
    assert split(values["FLOCK_TO"]) == [t.collector for t in DECISION.targets]
    assert set(values) == set(KNOBS)


def test_htcondor_reads_the_fragment_as_meant() -> None:
    base = "ALLOW_WRITE = $(FULL_HOSTNAME), *.local.example.org\nALLOW_READ = *\n"
    got = parse_with_htcondor(base + EXPECTED, KNOBS)
    order = [t.collector for t in DECISION.targets]
    # the schedd needs equal-length collector and negotiator lists, in FLOCK_TO's order
    assert split(got["FLOCK_TO"]) == split(got["FLOCK_COLLECTOR_HOSTS"]) == order
    assert split(got["FLOCK_NEGOTIATOR_HOSTS"]) == order
    hosts = [h for a in ADMITTED for h in (a.submit_hosts if isinstance(a, FlockSource) else [a])]
    assert split(got["FLOCK_FROM"]) == hosts
    for knob in ("ALLOW_WRITE_COLLECTOR", "ALLOW_WRITE_STARTD"):
        assert split(got[knob])[1:] == ["*.local.example.org", *hosts]
    assert split(got["ALLOW_READ_STARTD"]) == ["*", *hosts]
    # with no base lists HTCondor allows everyone; the guard keeps it that way
    bare = parse_with_htcondor(EXPECTED, KNOBS)
    assert bare["ALLOW_WRITE_COLLECTOR"] is None and bare["ALLOW_READ_STARTD"] is None


def test_htcondor_rejects_what_our_checker_rejects() -> None:
    bad = "flock-to = cm.example.org\n"
    with pytest.raises(CondorError, match="Illegal Identifier"):
        parse_with_htcondor(bad, ["FLOCK_TO"])
    with pytest.raises(CondorError, match="line 1"):
        parse_config(bad)


def test_disabled_decision_and_static_partners() -> None:
    off = FlockDecision(enabled=False, targets=DECISION.targets, epoch=3, seq=18)
    text = render_submit_config(off)
    assert "FLOCK_TO =\n" in text and "off" in text
    assert parse_config(text)["FLOCK_TO"] == ""
    static = render_submit_config(DECISION, static_flock_to=["cm.partner.example.org", "192.0.2.7"])
    to = split(parse_config(static)["FLOCK_TO"])
    assert to == [*(t.collector for t in DECISION.targets), "cm.partner.example.org"]
    assert split(
        parse_config(render_submit_config(off, static_flock_to=["cm.p.org"]))["FLOCK_TO"]
    ) == ["cm.p.org"]
    got = parse_with_htcondor(text, ["FLOCK_TO", "FLOCK_COLLECTOR_HOSTS"])
    assert got == {"FLOCK_TO": None, "FLOCK_COLLECTOR_HOSTS": None}  # empty reads as unset


def test_optional_schedd_knobs() -> None:
    text = render_submit_config(DECISION, flock_increment=2, min_flock_level=1)
    got = parse_with_htcondor(text, ["FLOCK_INCREMENT", "MIN_FLOCK_LEVEL"])
    assert got == {"FLOCK_INCREMENT": 2, "MIN_FLOCK_LEVEL": 1}
    with pytest.raises(CondorError):
        render_submit_config(DECISION, flock_increment=0)


@pytest.mark.parametrize(
    "contact",
    [
        "cm.example.org\nALLOW_ADMINISTRATOR = *",
        "cm.example.org, evil.example.org",
        "$(ALLOW_WRITE)",
        "cm.example.org:99999",
        "cm .example.org",
        "-cm.example.org",
        "",
        "cm.example.org#",
    ],
)
def test_injected_contacts_are_refused(contact: str) -> None:
    assert not is_valid_contact(contact)
    bad = FlockDecision(enabled=True, targets=(target(contact, 0.01),))
    with pytest.raises(CondorError):
        render_flock_config(bad)
    with pytest.raises(CondorError):
        render_condor_host(contact)


def test_contact_and_pattern_grammar() -> None:
    for ok in ("cm", "cm.example.org", "cm.example.org:9618", "192.0.2.1:9618", "[2001:db8::1]"):
        assert is_valid_contact(ok), ok
    for ok in ("*.cs.wisc.edu", "10.1.*", "10.1.0.0/16", "condor@example.org/*.example.org"):
        assert is_valid_host_pattern(ok), ok
    for bad in ("a b", "x,y", "$(X)", "10.1.0.0/33", "a\nb"):
        assert not is_valid_host_pattern(bad), bad
    with pytest.raises(CondorError):
        FlockSource("evil", ("ok.example.org", "bad host"))
    with pytest.raises(CondorError):
        render_execute_config(["ok.example.org, *"])


def test_nobody_admitted_revokes_flock_from() -> None:
    text = render_execute_config([])
    assert parse_config(text)["FLOCK_FROM"] == ""
    assert parse_with_htcondor(text, ["FLOCK_FROM"]) == {"FLOCK_FROM": None}


def test_condor_host_rendering() -> None:
    assert render_condor_host("cm2.example.org:9618") == (
        "# flockring: central manager is cm2.example.org:9618\n"
        "CONDOR_HOST = cm2.example.org\n"
        "COLLECTOR_HOST = cm2.example.org:9618\n"
    )
    text = render_condor_host("[2001:db8::1]:9618", subsystem="startd")
    got = parse_with_htcondor(text, ["STARTD.CONDOR_HOST", "STARTD.COLLECTOR_HOST", "CONDOR_HOST"])
    assert got == {
        "STARTD.CONDOR_HOST": "[2001:db8::1]",
        "STARTD.COLLECTOR_HOST": "[2001:db8::1]:9618",
        "CONDOR_HOST": None,
    }
    with pytest.raises(CondorError):
        render_condor_host("cm.example.org", subsystem="STARTD.X")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("FLOCK_TO = a.org\nFLOCK_TO = b.org\n", 2),
        ("FLOCK_TO = a.org \\\n", 1),
        ("FLOCK_TO = $(X\n", 1),
        ("CONDOR_HOST = a.org b.org\n", 1),
        ("MIN_FLOCK_LEVEL = -1\n", 1),
        ("MIN_FLOCK_LEVEL = (1 +\n", 1),
        ("FLOCK_FROM = a.org\nif defined X\nALLOW_READ_STARTD = *\n", 2),
        ("endif\n", 1),
        ("COLLECTOR_HOST =\n", 1),
        ('FLOCK_FROM = "a.org"\n', 1),
    ],
)
def test_checker_names_the_bad_line(text: str, line: int) -> None:
    with pytest.raises(CondorError, match=f"line {line}"):
        parse_config(text)
