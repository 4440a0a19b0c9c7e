"""The TOML policy file: patterns, deny-wins, defaults per action, and errors that name the file,
the line and the problem (Butt et al. 2006 §3.4, §4.1).

The allow/deny decision is checked against an oracle written independently of the module: a
brute-force evaluation of the documented rule over every (pattern set, peer) combination."""

from __future__ import annotations

import fnmatch
import itertools
from pathlib import Path

import pytest

from discovery.policy import (
    ACTIONS,
    ANNOUNCE_FROM,
    FLOCK_TO,
    QUERY_FROM,
    Peer,
    Policy,
    PolicyError,
    collector_host,
)
from discovery.policy_rules import compile_pattern

EXAMPLE = """\
# flock policy of pool A
[announce-from]
default = "allow"
allow = ["host:*.cs.wisc.edu"]
deny = [
  "host:bad.cs.wisc.edu",
  "id:00ff",
]

[flock-to]
default = "deny"
allow = ["host:*.wisc.edu", "addr:10.0.0.0/8", "*.example.org"]
deny = ["addr:10.66.*"]

[accept-flock-from]
allow = ["*"]

[query-from]
deny = ["*"]

[sharing]
share_threshold = 2
max_machines = 40
quota = 10
blacklist_s = 900

[[agreement]]
peers = ["host:*.cs.wisc.edu"]
direction = "to"
quota = 3
"""

PEERS = [
    Peer("00ff" + "1" * 36, "cm.cs.wisc.edu", "udp://10.1.2.3:9000"),
    Peer("a" * 40, "bad.cs.wisc.edu", "udp://192.168.0.1:9000"),
    Peer("b" * 40, "pool.physics.wisc.edu", "udp://10.66.0.9:9000"),
    Peer("c" * 40, "cm.example.org", "udp://172.16.0.1:9000"),
    Peer("d" * 40, "", "udp://10.9.9.9:9000"),
    Peer("e" * 40, "cm.elsewhere.net", "udp://8.8.8.8:9000"),
]


def test_example_file_decisions() -> None:
    pol = Policy.loads(EXAMPLE, "a.toml")
    p0, _, _, p3, _, p5 = PEERS
    # announce-from: deny by id prefix and by host beat the *.cs.wisc.edu allow
    assert [pol.allows(ANNOUNCE_FROM, p) for p in PEERS] == [False, False, True, True, True, True]
    # flock-to: default deny; allowed by host, CIDR or bare pattern; addr 10.66.* denied
    assert [pol.allows(FLOCK_TO, p) for p in PEERS] == [True, True, False, True, True, False]
    assert not any(pol.allows(QUERY_FROM, p) for p in PEERS)
    assert pol.sharing.share_threshold == 2 and pol.sharing.blacklist_s == 900.0
    assert pol.quota_for(p0) == 3 and pol.quota_for(p3) == 10
    assert not pol.may_accept_flock_from(p0)  # direction "to"
    assert pol.may_flock_to(p0) and not pol.may_flock_to(p5)


def _oracle(allow: list[str], deny: list[str], default: bool, p: Peer) -> bool:
    """The documented rule, evaluated from scratch."""

    def match(pat: str) -> bool:
        kind, _, body = pat.partition(":")
        if not body:
            kind, body = "any", pat
        body = body.lower()
        if body == "*":
            return True
        addr_host = p.address.split("://")[-1].rsplit(":", 1)[0]
        if kind == "id":
            return fnmatch.fnmatchcase(p.node_id, body if "*" in body else body + "*")
        if kind == "host":
            return bool(p.host) and fnmatch.fnmatchcase(p.host, body)
        addr = fnmatch.fnmatchcase(p.address, body) or fnmatch.fnmatchcase(addr_host, body)
        if kind == "addr":
            return addr
        return addr or (bool(p.host) and fnmatch.fnmatchcase(p.host, body))

    if any(match(x) for x in deny):
        return False
    if any(match(x) for x in allow):
        return True
    return default


PATTERNS = ["*", "id:00ff", "id:a*", "host:*.wisc.edu", "cm.*", "addr:10.*", "*.example.org"]


def test_deny_wins_over_allow_for_every_combination() -> None:
    checked = 0
    for n_allow, n_deny in itertools.product(range(3), range(3)):
        for allow in itertools.combinations(PATTERNS, n_allow):
            for deny in itertools.combinations(PATTERNS, n_deny):
                for default in ("allow", "deny"):
                    text = (
                        f'[flock-to]\ndefault = "{default}"\n'
                        f"allow = {list(allow)!r}\ndeny = {list(deny)!r}\n"
                    ).replace("'", '"')
                    pol = Policy.loads(text)
                    for p in PEERS:
                        want = _oracle(list(allow), list(deny), default == "allow", p)
                        assert pol.allows(FLOCK_TO, p) is want, (allow, deny, default, p)
                        checked += 1
    assert checked > 10_000


def test_flock_from_hosts_for_htcondor() -> None:
    assert Policy.allow_all().flock_from_hosts() == ("*",)
    pol = Policy.loads(
        '[accept-flock-from]\ndefault = "deny"\n'
        'allow = ["host:*.cs.wisc.edu", "id:00ff", "cm.example.org", "addr:10.0.0.0/8"]\n'
    )
    assert pol.flock_from_hosts() == ("*.cs.wisc.edu", "cm.example.org")
    assert Policy.loads('[accept-flock-from]\ndeny = ["*"]\n').flock_from_hosts() == ()


def test_defaults_per_action() -> None:
    pol = Policy.loads('[query-from]\ndefault = "deny"\n[invite-from]\ndefault = "allow"\n')
    p = PEERS[5]
    assert {a: pol.allows(a, p) for a in ACTIONS} == {
        "announce-from": True,
        "flock-to": True,
        "accept-flock-from": True,
        "query-from": False,
        "invite-from": True,
        # trust with blacklists is never a default (Butt et al. 2006 §3.2.1: "trusted pools")
        "blacklist-from": False,
        "blacklist-to": False,
    }
    assert Policy.allow_all().allows("query-from", p)


def test_patterns() -> None:
    assert compile_pattern("id:3FA2").matches(Peer("3fa2" + "0" * 36))
    assert not compile_pattern("id:3fa2").matches(Peer("03fa2" + "0" * 35))
    assert compile_pattern("addr:192.168.0.0/16").matches(Peer(address="udp://192.168.4.2:1"))
    assert not compile_pattern("addr:192.168.0.0/16").matches(Peer(address="udp://10.0.0.1:1"))
    assert compile_pattern("addr:fe80::/10").matches(Peer(address="udp://[fe80::1]:9000"))
    assert compile_pattern("HOST:CM.Example.ORG").matches(Peer(host="cm.example.org"))
    assert compile_pattern("host:*").matches(Peer())  # universal: matches even the unknown
    assert collector_host("<10.0.0.1:9618?sock=collector>") == "10.0.0.1"
    assert collector_host("CM.Example.org:9618") == "cm.example.org"
    assert collector_host("[::1]:9618") == "::1"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('[announce-from]\nallow = ["a",\n  "b"\n\n[flock-to]\n', 5, "Unclosed array"),
        ('[flock-to]\nallow = ["ok"]\nallow = ["dup"]\n', 3, "TOML syntax"),
        ('[flock_to]\nallow = ["x"]\n', 1, "did you mean 'flock-to'"),
        ('\n[flock-to]\nalow = ["x"]\n', 3, "unknown key 'alow'"),
        ('[flock-to]\nallow = "host:x"\n', 2, "expected a list of patterns"),
        ('[flock-to]\nallow = [\n  "ok",\n  "id:xyz",\n]\n', 4, "hex"),
        ('[flock-to]\nallow = [\n  "ok",\n  "",\n]\n', 4, "empty pattern"),
        ('[flock-to]\n\ndefault = "maybe"\n', 3, "default must be"),
        ("[sharing]\nquota = 3\nshare_threshold = -1\n", 3, "whole number"),
        ('[sharing]\nblacklist_s = "1h"\n', 2, "seconds"),
        ('[flock-to]\ndeny = ["addr:10.0.0.0/33"]\n', 2, "CIDR"),
        (
            '[[agreement]]\npeers = ["*"]\n[[agreement]]\npeers = ["x"]\ndirection = "up"\n',
            5,
            "direction",
        ),
        ('[[agreement]]\ndirection = "to"\n', 1, "missing 'peers'"),
        ('[[agreement]]\npeers = ["a"]\nquota = 1.5\n', 3, "whole number"),
        ('[[user]]\nname = "a*"\nallow = "no"\n', 3, "true or false"),
        ("[[user]]\nquota = 2\n", 1, "'name'"),
        ("flock-to = 3\n", 1, "must be a table"),
        ('[flock-to]\nallow = [\n  "a",\n  "b",\n', 4, "end of document"),
    ],
)
def test_malformed_policy_names_file_line_and_problem(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    f = tmp_path / "policy.toml"
    f.write_text(text)
    with pytest.raises(PolicyError) as ei:
        Policy.load(f)
    e = ei.value
    assert e.line == line, str(e)
    assert e.source == str(f)
    assert str(e).startswith(f"{f}:{line}: ")
    assert words in str(e)


def test_missing_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy file"):
        Policy.load(tmp_path / "nope.toml")


def test_load_reads_a_file(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text(EXAMPLE)
    assert Policy.load(f) == Policy.loads(EXAMPLE, str(f))


def test_unknown_action_name_in_code_is_an_error() -> None:
    with pytest.raises(PolicyError, match="unknown action"):
        Policy.allow_all().allows("flock-from", PEERS[0])


def test_the_documented_example_loads() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "discovery.md").read_text()
    block = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    pol = Policy.loads(block, "docs/discovery.md")
    wisc = Peer("1" * 40, "cm.cs.wisc.edu", "udp://10.1.1.1:9000")
    ex = Peer("2" * 40, "cm.example.org", "udp://10.2.2.2:9000")
    assert pol.may_flock_to(wisc) and not pol.may_accept_flock_from(wisc)  # direction "to"
    assert pol.may_accept_flock_from(ex) and pol.quota_for(ex) == 5
    assert pol.offer_to(ex, 60) == 50 and pol.offer_to(ex, 4) == 0
    assert not pol.admits(ex, "mallory@example.org") and pol.admits(ex, "alice@example.org")
    assert pol.quota_for(ex, "carol@cs.example.org") == 2
