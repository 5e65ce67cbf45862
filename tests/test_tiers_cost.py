"""The load-or-recompute model (`tiers.cost`) against values worked out by hand, and its
break-even against a brute-force scan written here from the formulas."""

from __future__ import annotations

import math

import pytest

from mambaradix.geometry.profile import PROFILES, get_profile
from mambaradix.tiers.cost import (
    H100_PREFILL,
    H200_PREFILL,
    PCIE5_X16,
    TIERS,
    HitCost,
    Link,
    LoadRule,
    Prefill,
    Tier,
    break_even,
    load_s,
    recompute_s,
)

TERA = Prefill("1 TFLOP/s", 1e12, 1.0, "test")
ONE_LINK = Tier("1 GB/s, 1 ms", (Link("l", 1e9, 1e-3, "test"),))


def test_load_and_recompute_by_hand() -> None:
    m = HitCost("m", state_bytes=1_000_000, kv_bytes_per_token=1000,
                linear_flops_per_token=10**9, attn_flops_per_pair=10**6)  # fmt: skip
    # load: 1 ms + (1e6 + 1000 n) B / 1e9 B/s
    assert load_s(m, ONE_LINK, 0) == pytest.approx(2e-3)
    assert load_s(m, ONE_LINK, 100) == pytest.approx(2.1e-3)
    # recompute: (1e9 n + 1e6 n (n + 1) / 2) / 1e12
    assert recompute_s(m, TERA, 1) == pytest.approx(1.001e-3)
    assert recompute_s(m, TERA, 10) == pytest.approx(10.055e-3)
    two = Tier("store then PCIe", (Link("a", 1e9, 1e-3, "t"), Link("b", 2e9, 5e-4, "t")))
    # latencies add (1.5 ms), and so do the per-byte times (1 + 0.5 ns per byte)
    assert load_s(m, two, 0) == pytest.approx(1.5e-3 + 1e6 * 1.5e-9)
    assert m.hit_bytes(3) == 1_003_000 and m.prefill_flops(2) == 2 * 10**9 + 3 * 10**6


def test_break_even_by_hand() -> None:
    # recompute 1 ms per token; load 2 ms + 1 us per token: n = 2 loses (2 vs 2.002 ms),
    # n = 3 wins (3 vs 2.003 ms)
    linear = HitCost("linear", 1_000_000, 1000, 10**9, 0)
    assert break_even(linear, ONE_LINK, TERA) == 3
    # attention only: recompute n (n + 1) x 0.1 ms; load 1 s: n = 99 gives 0.99 s, n = 100
    # gives 1.01 s
    square = HitCost("square", 10**9, 0, 0, 2 * 10**8)
    no_latency = Tier("1 GB/s", (Link("l", 1e9, 0.0, "t"),))
    assert break_even(square, no_latency, TERA) == 100
    # loading a token's KV (1 ms) costs more than computing it (0.1 ms), no attention: never
    never = HitCost("never", 0, 10**6, 10**8, 0)
    assert break_even(never, ONE_LINK, TERA) is None
    # nothing to load but the latency, and the first token's compute already exceeds it
    cheap = HitCost("cheap", 0, 0, 2 * 10**9, 0)
    assert break_even(cheap, ONE_LINK, TERA) == 1


def brute_force(m: HitCost, tier: Tier, prefill: Prefill, limit: int = 10**6) -> int | None:
    """The first n whose load beats its recompute, from the formulas, one n at a time."""
    latency = sum(link.latency_s for link in tier.links)
    for n in range(1, limit):
        nbytes = m.state_bytes + n * m.kv_bytes_per_token
        load = latency + sum(nbytes / link.bandwidth for link in tier.links)
        flops = m.linear_flops_per_token * n + m.attn_flops_per_pair * n * (n + 1) / 2
        if load < flops / (prefill.peak_flops * prefill.mfu):
            return n
    return None


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_break_even_equals_a_brute_force_scan(name: str) -> None:
    model = HitCost.of(name, get_profile(name))
    for tier in TIERS.values():
        for prefill in (H100_PREFILL, Prefill("slow", 1e11, 0.5, "t")):
            assert break_even(model, tier, prefill) == brute_force(model, tier, prefill)


def test_published_defaults() -> None:
    assert PCIE5_X16.bandwidth == 64e9  # 128 GB/s both ways, per the H100/H200 datasheets
    assert H100_PREFILL.flops_per_s == H200_PREFILL.flops_per_s == pytest.approx(296.82e12)
    assert [len(t.links) for t in TIERS.values()] == [1, 2, 2, 2]
    assert all(t.links[-1] is PCIE5_X16 for t in TIERS.values())
    # Nemotron-H-8B (state 102,137,856 B; 16 KiB of KV per token) from host memory:
    # load(n) = 10 us + (102137856 + 16384 n) / 64e9; recompute(n) = F(n) / 296.82e12
    nemotron = HitCost.of("nemotron-h-8b", get_profile("nemotron-h-8b"))
    assert nemotron.state_bytes == 102_137_856 and nemotron.kv_bytes_per_token == 16384
    n = break_even(nemotron, TIERS["host"], H100_PREFILL)
    assert n is not None
    t_load = 10e-6 + (102_137_856 + 16384 * n) / 64e9
    assert t_load == pytest.approx(load_s(nemotron, TIERS["host"], n))
    assert recompute_s(nemotron, H100_PREFILL, n) > t_load
    assert recompute_s(nemotron, H100_PREFILL, n - 1) <= load_s(nemotron, TIERS["host"], n - 1)


def test_bad_figures_are_refused() -> None:
    with pytest.raises(ValueError, match="bandwidth"):
        Link("x", 0.0, 0.0, "t")
    with pytest.raises(ValueError, match="latency_s"):
        Link("x", 1.0, -1.0, "t")
    with pytest.raises(ValueError, match="bandwidth"):
        Link("x", math.inf, 0.0, "t")
    with pytest.raises(ValueError, match="mfu"):
        Prefill("x", 1e12, 1.5, "t")
    with pytest.raises(ValueError, match="state_bytes"):
        HitCost("x", -1, 0, 0, 0)
    with pytest.raises(ValueError, match="links"):
        Tier("x", ())
    with pytest.raises(ValueError, match="n must be"):
        load_s(HitCost("x", 0, 0, 0, 0), ONE_LINK, -1)


def test_the_per_hit_choice_by_hand() -> None:
    """`lifecycle.tiers.cheapest` under a `LoadRule` (the engine's; the replay calls the
    same choice): recomputing n tokens takes n / 32 s, a load 1 s per link crossed (the
    bytes add ~1e-25 s), so a hit pays off beyond 32 tokens past the device's prefix."""
    from mambaradix.lifecycle.tiers import Candidate, cheapest

    fast = Link("l", 1e30, 1.0, "test")
    rule = LoadRule(HitCost("m", 0, 0, 1, 0), Prefill("p", 32.0, 1.0, "test"), fast, fast)

    def pick(depths: list[int], start: int, store_bytes: int = 0) -> int | None:
        cands = [Candidate(d, 8, store_bytes) for d in depths]
        got = cheapest(cands, start, lambda c: rule.load_s(c.host_bytes, c.store_bytes),
                       rule.recompute_s)  # fmt: skip
        return None if got is None else got.depth

    assert pick([16], 0) is None  # 0.5 s to recompute against 1 s to load
    assert pick([16, 32, 48], 0) == 48  # saves 1.5 - 1 s; 32 saves less than nothing
    assert pick([48], 16) is None  # 32 new tokens: 1 s either way, plus the bytes
    assert pick([48], 0, store_bytes=8) is None  # from the store: 2 s
    assert pick([80], 0, store_bytes=8) == 80  # 2.5 s to recompute
    # attention: 2 FLOPs per pair; 2 new tokens after 3 attend to 4 and 5 keys: 18 FLOPs
    attn = LoadRule(HitCost("m", 0, 0, 0, 2), Prefill("p", 1.0, 1.0, "test"), fast, fast)
    assert attn.recompute_s(3, 2) == 18.0 and attn.model.prefill_flops(2) == 6
    with pytest.raises(TypeError, match="prefill"):
        LoadRule(HitCost("m", 0, 0, 1, 0), 32.0, fast, fast)  # type: ignore[arg-type]
