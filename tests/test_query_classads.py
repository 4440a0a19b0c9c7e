"""ClassAd wrappers and machine ads: parsing errors, the negotiator's rank reading, outcomes,
dynamic attributes, the stamp, PonD's Zipf attribute, the live startd provider (recorded ads).

Every expectation about ClassAd semantics is checked against ``classad2`` itself
(``symmetricMatch``, ``eval``), never against a hand-written evaluator.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import classad2
import pytest

from discovery.classads import (
    ERROR,
    MATCH,
    REJECT,
    UNDEFINED,
    JobAd,
    QuerySyntaxError,
    evaluate,
    job_ad,
    negotiator_key,
    parse_ad,
    parse_expr,
    rank_number,
    target_refs,
)
from discovery.machine import (
    CondorStartdProvider,
    DictProvider,
    MachineAd,
    MachineAdError,
    Stamp,
    random_machine_ad,
    zipf_value,
)
from overlay.errors import OverlayError

# What `condor_status -long` prints for a partitionable-slot machine (HTCondor 23.x format,
# trimmed): the live provider reads these through a collector query.
RECORDED_STARTD = """\
Activity = "Idle"
Arch = "X86_64"
Cpus = 8
Disk = 48123456
KeyboardIdle = 1234
LoadAvg = 0.12
Machine = "exec-01.example.org"
Memory = 15876
MyType = "Machine"
Name = "slot1@exec-01.example.org"
OpSys = "LINUX"
Requirements = START && (WithinResourceLimits)
START = true
State = "Unclaimed"
TotalLoadAvg = 0.37

Activity = "Busy"
Arch = "X86_64"
Cpus = 4
LoadAvg = 1.0
Machine = "exec-02.example.org"
Memory = 2048
MyType = "Machine"
Name = "slot1@exec-02.example.org"
State = "Claimed"
"""


# ---------------------------------------------------------------------- parsing
@pytest.mark.parametrize("text", ["Memory >", "1 2", '"open', "foo(", "   ", "a = 3"])
def test_parse_expr_errors_carry_the_parser_message_and_text(text: str) -> None:
    with pytest.raises(QuerySyntaxError) as ei:
        parse_expr(text, "Requirements")
    e = ei.value
    assert isinstance(e, OverlayError) and isinstance(e, ValueError)
    assert e.text == text and e.what == "Requirements" and e.parser_message
    assert repr(text) in str(e)


def test_parse_ad_both_syntaxes_and_errors_name_the_line() -> None:
    new = parse_ad('[ Memory = 2048; Arch = "X86_64"; Requirements = MY.Memory > 1 ]')
    old = parse_ad('# a comment\nMemory = 2048\nArch = "X86_64"\n\nRequirements = MY.Memory > 1\n')
    assert dict(new.items()).keys() == dict(old.items()).keys()
    assert new.eval("Requirements") is True and old.eval("Requirements") is True
    with pytest.raises(QuerySyntaxError) as ei:
        parse_ad("Memory = 2048\nCpus = 4 4\n")
    assert "line 2" in ei.value.what
    with pytest.raises(QuerySyntaxError):
        parse_ad("[ Memory = 2048 ] and then garbage")  # ClassAd() alone would accept this
    with pytest.raises(QuerySyntaxError):
        parse_ad("just words")


def test_job_ad_names_the_bad_expression() -> None:
    with pytest.raises(QuerySyntaxError) as ei:
        job_ad("Memory > 1", "Memory +")
    assert ei.value.what == "Rank"
    ad = job_ad("TARGET.Memory > 1024", 3.5, {"Owner": "alice"})
    assert ad["Rank"] == 3.5 and ad["Owner"] == "alice" and ad["MyType"] == "Job"


# ---------------------------------------------------------------------- ranks and outcomes
@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("7", 7.0),
        ("2.5", 2.5),
        ("-3", -3.0),
        ("true", 1.0),
        ("false", 0.0),
        ('"fast"', 0.0),
        ("{1, 2}", 0.0),
        ("[ a = 1 ]", 0.0),
        ("undefined", 0.0),
        ("error", 0.0),
        ("1 / 0", 0.0),
        ('real("NaN")', 0.0),
        ('real("INF")', math.inf),
        ("TARGET.NoSuch", 0.0),
    ],
)
def test_rank_reads_as_the_negotiator_does(expr: str, want: float) -> None:
    job = classad2.ClassAd()
    job["Requirements"] = True
    job["Rank"] = classad2.ExprTree(expr)
    machine = classad2.ClassAd("[ Requirements = true; Memory = 1 ]")
    raw = job.lookup("Rank").eval(scope=job, target=machine)  # what classad2 itself says
    assert rank_number(raw) == want
    outcome, jr, _ = evaluate(JobAd(job), machine)
    assert outcome == MATCH and jr == want


def test_negotiator_key_orders_job_rank_then_machine_rank_then_id() -> None:
    keys = [negotiator_key(1.0, 0.0, 5), negotiator_key(2.0, 0.0, 9), negotiator_key(1.0, 3.0, 7)]
    keys.append(negotiator_key(1.0, 0.0, 2))
    assert sorted(keys) == [(-2.0, -0.0, 9), (-1.0, -3.0, 7), (-1.0, -0.0, 2), (-1.0, -0.0, 5)]


def test_outcomes_agree_with_symmetric_match_and_classify_failures() -> None:
    rng = random.Random(4)
    jobs = [
        JobAd(job_ad("TARGET.Memory >= 4096", "TARGET.Memory", {"Owner": "mallory"})),
        JobAd(job_ad('Memory > 1024 && Arch == "X86_64"', "Cpus")),  # unscoped names
        JobAd(job_ad("TARGET.Gpus > 0")),  # an attribute no machine has
    ]
    seen: Counter[str] = Counter()
    for i in range(400):
        m = random_machine_ad(rng, f"m{i}", unevaluable_fraction=0.1)
        for j in jobs:
            outcome, jr, mr = evaluate(j, m)
            seen[outcome] += 1
            assert (outcome == MATCH) == (j.ad.symmetricMatch(m) is True)
            if outcome == MATCH:
                want = j.ad.lookup("Rank").eval(scope=j.ad, target=m) if j.rank is not None else 0
                assert jr == rank_number(want)
            else:
                assert (jr, mr) == (0.0, 0.0)
            req = j.ad.lookup("Requirements").eval(scope=j.ad, target=m)
            if req is classad2.Value.Error:
                assert outcome == ERROR
    assert all(seen[o] > 0 for o in (MATCH, REJECT, UNDEFINED, ERROR)), seen


def test_a_machine_without_requirements_never_matches() -> None:
    job = JobAd(job_ad("true"))
    assert evaluate(job, classad2.ClassAd("[ Memory = 1 ]"))[0] == UNDEFINED
    assert evaluate(job, classad2.ClassAd("[ Memory = 1; Requirements = false ]"))[0] == REJECT


def test_target_refs_name_what_the_job_reads_of_the_machine() -> None:
    ad = job_ad('TARGET.Memory > 1024 && Arch == "X86_64" && MY.Owner == "a"', "TARGET.KFlops")
    ad["Owner"] = "a"
    assert target_refs(ad) == ("Arch", "KFlops", "Memory")


# ---------------------------------------------------------------------- machine ads
def test_zipf_attribute_matches_pond_section_4_2_2() -> None:
    rng = random.Random(1)
    n = 40_000
    c = Counter(zipf_value(rng) for _ in range(n))
    assert set(c) == set(range(1, 11))
    h10 = sum(1 / i for i in range(1, 11))
    for i in (1, 2, 5, 10):  # P(i) = (1/i) / H_10; ~35 % at 1
        assert abs(c[i] / n - (1 / i) / h10) < 0.01
    assert random.Random(9).random() == random.Random(9).random()
    a = [zipf_value(random.Random(3)) for _ in range(3)]
    assert a == [zipf_value(random.Random(3)) for _ in range(3)]


def test_machine_ad_layers_dynamic_values_and_the_stamp() -> None:
    prov = DictProvider({"State": "Unclaimed", "LoadAvg": 0.1, "Scratch": 1})
    m = MachineAd(parse_ad('[ Name = "a"; Memory = 4096; Requirements = true ]'), prov)
    ad = m.current()
    assert ad["LoadAvg"] == 0.1 and ad["State"] == "Unclaimed" and ad["Scratch"] == 1
    prov.values.pop("Scratch")
    prov.set(LoadAvg=0.9)
    ad = m.current()
    assert ad["LoadAvg"] == 0.9 and "Scratch" not in ad
    m.set_stamp(Stamp("job.1", "ab" * 20, 7))
    ad = m.current()
    assert (ad["PondJobId"], ad["State"]) == ("job.1", "Claimed") and m.claimed
    with pytest.raises(MachineAdError):
        m.set_stamp(Stamp("job.2", "cd" * 20, 8))
    m.clear_stamp()
    ad = m.current()
    assert "PondJobId" not in ad and ad["State"] == "Unclaimed" and not m.claimed
    snap = m.snapshot()
    prov.set(LoadAvg=0.5)
    assert snap["LoadAvg"] == 0.9  # a snapshot is a copy
    assert parse_ad(m.project(["Memory", "Name", "NoSuch"])).keys() == {"Memory", "Name"}


def test_machine_ad_from_file(tmp_path: Path) -> None:
    p = tmp_path / "machine.ad"
    p.write_text('Name = "n1"\nMemory = 2048\nRequirements = TARGET.ImageSize < MY.Memory\n')
    m = MachineAd.from_file(p)
    assert m.current()["Memory"] == 2048
    p.write_text('Name = "n1"\nMemory = 20 48\n')
    with pytest.raises(QuerySyntaxError) as ei:
        MachineAd.from_file(p)
    assert str(p) in ei.value.what and "line 2" in ei.value.what
    with pytest.raises(MachineAdError):
        MachineAd.from_file(tmp_path / "absent.ad")


class RecordedCollector:
    """Serves recorded startd ads; the constraint is evaluated by classad2, as a collector
    does."""

    def __init__(self, text: str) -> None:
        self.ads = [parse_ad(block) for block in text.strip().split("\n\n")]
        self.calls: list[tuple[Any, str, list[str]]] = []

    def query(self, ad_type: Any, constraint: str, projection: list[str]) -> list[Any]:
        self.calls.append((ad_type, constraint, projection))
        c = classad2.ExprTree(constraint)
        out = []
        for ad in self.ads:
            if c.eval(scope=ad) is True:
                sub = classad2.ClassAd()
                for k in projection:
                    if k in ad:
                        sub[k] = ad.lookup(k)
                out.append(sub)
        return out


def test_condor_startd_provider_reads_recorded_ads() -> None:
    coll = RecordedCollector(RECORDED_STARTD)
    prov = CondorStartdProvider("slot1@exec-02.example.org", collector=coll)
    assert prov.dynamic() == {}
    assert prov.refresh()
    assert prov.dynamic()["State"] == "Claimed" and prov.dynamic()["Memory"] == 2048
    assert 'Name == "slot1@exec-02.example.org"' in coll.calls[0][1]
    m = MachineAd(parse_ad('[ Name = "slot1@exec-02.example.org"; Requirements = true ]'), prov)
    assert m.current()["Activity"] == "Busy"
    errors: list[Exception] = []
    gone = CondorStartdProvider("slot9@nowhere", collector=coll, on_error=errors.append)
    assert not gone.refresh() and gone.failures == 1 and errors
