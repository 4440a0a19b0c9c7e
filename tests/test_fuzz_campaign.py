"""A small run of the fuzz campaign (``flockring bench fuzz`` runs the 10^6 one).

Decoder: hypothesis-drawn messages of every overlay kind, sealed, mutated; no input raises out of
a decoder, every input is counted (decoded or dropped by a named reason), and the counts balance.
Live: datagrams of every hostile kind (random, mutated captures, replays, forged signatures and
bodies, unsigned, spoofed ids, re-signed mutants, oversized, deeply nested) at a running node on
loopback; nothing crashes, the node's stats account for every datagram, and it still serves.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.wire import Wire, encode_message
from sim_adapter.bench.fuzz_decoder import (
    DecoderHarness,
    deep_body,
    message_strategy,
    mutate,
    run_decoder,
)
from sim_adapter.bench.fuzz_live import _LIVE_KINDS, run_live
from transports.codec import Limits


def test_decoder_campaign_has_no_crash_and_counts_every_input() -> None:
    out = run_decoder(30_000, seed=3, seeds=300)
    assert out["inputs"] == 30_000
    assert out["crashes"] == 0, out["crash_tracebacks"]
    assert out["balanced"]
    assert out["seed_roundtrip_mismatches"] == 0
    assert out["seed_kinds"] >= 25  # hypothesis reached most message kinds
    # the campaign reaches every layer: parse failures, type checks and deep nesting
    for reason in ("codec.malformed", "wire.malformed", "wire.bad_message"):
        assert out["dropped"].get(reason, 0) > 0, reason
    assert out["decoded"] > 0


def test_a_deeply_nested_payload_is_dropped_as_too_deep() -> None:
    w = Wire(Limits())
    assert w.decode(deep_body(5)) is not None
    for depth in (25, 200):
        assert w.decode(deep_body(depth)) is None
    assert w.counters["too_deep"] == 2
    # past msgpack's own stack limit (1,024) the C unpacker stops first: dropped as malformed
    assert w.decode(deep_body(5000)) is None
    assert w.counters["too_deep"] + w.counters["malformed"] == 3


def test_a_length_header_of_four_billion_is_refused_before_allocation() -> None:
    h = DecoderHarness()
    for head in (b"\xdd", b"\xdf", b"\xc6", b"\xdb"):
        h.body(head + b"\xff\xff\xff\xff")
        h.frame(head + b"\xff\xff\xff\xff")
    assert h.fates["crash"] == 0 and h.report()["balanced"]
    assert h.fates["body_dropped"] == 4 and h.fates["frame_dropped"] == 4


@settings(max_examples=150, deadline=None)
@given(message_strategy(), st.integers(0, 2**32))
def test_mutants_of_any_message_never_raise(msg: object, seed: int) -> None:
    body = encode_message(msg)  # type: ignore[arg-type]
    h = DecoderHarness()
    h.body(body)
    assert h.fates["body_decoded"] == 1  # the unmutated message decodes
    rng = random.Random(seed)
    for _ in range(20):
        h.body(mutate(body, rng, [body]))
    assert h.fates["crash"] == 0 and h.report()["balanced"]


def test_live_campaign_accounts_for_every_datagram() -> None:
    out = run_live(2200, seed=5, seeds=150)
    assert out["crashes"] == 0
    assert out["balanced"], out["checks"]
    assert out["lost_in_kernel"] == 0
    assert out["still_serves"]
    assert all(out["by_kind"][k] > 0 for k in _LIVE_KINDS)
    d = out["dropped"]
    for reason in ("auth.forged", "auth.replayed", "auth.unsigned", "wire.too_deep"):
        assert d.get(reason, 0) > 0, reason
    # spoofed ids pass the signature (the key is valid) and are refused by the core
    assert out["refused_by_core_after_delivery"].get("direct_origin_forged", 0) > 0
