"""The no_buffer request lifecycle: copy-on-write, checkpoints, donation,
eviction under pressure, aborts and refused admissions, without leaks."""

from __future__ import annotations

from array import array

import pytest

from lifecycle_sim import (
    Job,
    Simulator,
    check_everything,
    make_manager,
    multi_turn_jobs,
)
from mambaradix.lifecycle import Request
from mambaradix.sim import serve_request as run_request


def serve(mgr, pool, tokens, output=(7, 8, 9), chunk=16):  # type: ignore[no-untyped-def]
    req = Request(array("q", tokens))
    req.output_ids = list(output)
    assert mgr.admit(req)
    cached = req.cached_len
    assert run_request(mgr, pool, req, chunk)
    check_everything(mgr, pool)
    return cached


@pytest.mark.parametrize(
    "compat,chunk,expected", [(None, 64, 39), ("sglang", 64, 0), (None, 16, 39), ("sglang", 16, 32)]
)
def test_identical_resent_prompt_hits(compat: str | None, chunk: int, expected: int) -> None:
    """#22935: upstream's input-1 lookup misses the prompt-end state, so an
    identical prompt falls back to the last chunk checkpoint (0 with one
    chunk); ours checkpoints at input-1 and reuses all but the last token."""
    mgr, pool = make_manager(kv_tokens=1000, state_slots=16, compat=compat)
    prompt = list(range(100, 140))
    assert serve(mgr, pool, prompt, chunk=chunk) == 0
    assert serve(mgr, pool, prompt, chunk=chunk) == expected


def test_next_turn_reuses_prompt_and_answer() -> None:
    mgr, pool = make_manager(kv_tokens=1000, state_slots=16)
    prompt, answer = list(range(100, 140)), [7, 8, 9]
    serve(mgr, pool, prompt, answer)
    # The finished state sits after prompt + answer[:-1] (the last answer token
    # has no KV yet), so the next turn reuses exactly that much.
    assert serve(mgr, pool, prompt + answer + [1, 2, 3]) == len(prompt) + len(answer) - 1


def test_copy_on_write_leaves_cached_state_untouched() -> None:
    mgr, pool = make_manager(kv_tokens=1000, state_slots=16)
    prompt = list(range(50))
    serve(mgr, pool, prompt)
    req = Request(array("q", prompt + [1, 2]))
    req.output_ids = [5]
    assert mgr.admit(req)
    node = mgr.tree.match_prefix(req.input_ids[:-1]).node
    src_fp = pool.fingerprint(node.state)
    assert req.slot != node.state and pool.fingerprint(req.slot) == src_fp
    assert run_request(mgr, pool, req, 16)
    assert pool.fingerprint(node.state) == src_fp  # the request advanced its own copy
    check_everything(mgr, pool)


def test_abort_after_admission_leaks_nothing() -> None:
    """#12693 / #16067 / #21404: a request dropped between match and the end
    of its prefill gives back its slot, its private KV and its lock."""
    mgr, pool = make_manager(kv_tokens=500, state_slots=8)
    serve(mgr, pool, list(range(60)))
    free_kv, free_slots = mgr.kv.available_size(), mgr.slots.available_size()
    req = Request(array("q", list(range(60)) + [1, 2, 3, 4]))
    assert mgr.admit(req) and mgr.extend(req, 3) is not None
    mgr.abort(req)
    check_everything(mgr, pool)
    assert (mgr.kv.available_size(), mgr.slots.available_size()) == (free_kv, free_slots)
    assert mgr.tree.full_protected_size() == 0 and mgr.tree.state_protected_size() == 0


def test_refused_admission_holds_nothing() -> None:
    mgr, pool = make_manager(kv_tokens=500, state_slots=2, rows=1)
    a = Request(array("q", range(10)))
    assert mgr.admit(a)
    b = Request(array("q", range(10)))
    assert not mgr.admit(b)  # no row left
    assert b.row is None and b.slot is None and b.lock is None
    mgr.abort(a)
    check_everything(mgr, pool)
    assert mgr.slots.available_size() == 2 and mgr.kv.available_size() == 500


def test_eviction_frees_room_when_allocation_falls_short() -> None:
    mgr, pool = make_manager(kv_tokens=120, state_slots=4)
    for base in (0, 1000, 2000, 3000):
        serve(mgr, pool, list(range(base, base + 50)))
    assert mgr.evictions["kv_tokens"] > 0 and mgr.evictions["states"] > 0
    check_everything(mgr, pool)


@pytest.mark.parametrize("compat", [None, "sglang"])
def test_stress_small_pools(compat: str | None) -> None:
    """Many interleaved multi-turn requests through pools small enough to force
    KV eviction, state tombstoning, leaf deletion, refused admissions and
    retractions; conservation and fingerprints checked after every event."""
    totals: dict[str, int] = {}
    for seed in range(8):
        mgr, pool = make_manager(kv_tokens=300, state_slots=6, rows=5, compat=compat)
        jobs = multi_turn_jobs(seed, sessions=5, turns=5)
        stats = Simulator(mgr, pool, seed).run(jobs, max_running=4)
        assert stats["finished"] + stats["aborted"] == len(jobs)
        assert not mgr.active
        check_everything(mgr, pool)
        assert mgr.kv.available_size() + mgr.tree.total_size()[0] == 300
        assert mgr.slots.available_size() + mgr.tree.total_size()[1] == 6
        for key, value in {**stats, **mgr.evictions}.items():
            totals[key] = totals.get(key, 0) + value
    for path in ("refused", "retracted", "aborted", "kv_tokens", "states", "cached_tokens"):
        assert totals[path] > 0, f"the stress run never exercised {path}: {totals}"


def test_default_hits_more_than_sglang_on_multi_turn() -> None:
    rates = {}
    for compat in (None, "sglang"):
        mgr, pool = make_manager(kv_tokens=5000, state_slots=64, rows=4, compat=compat)
        stats = Simulator(mgr, pool, seed=1, abort_rate=0.0, check=False).run(
            multi_turn_jobs(1, sessions=4, turns=6), max_running=2
        )
        rates[compat] = stats["cached_tokens"] / stats["prompt_tokens"]
    assert rates[None] > rates["sglang"] > 0


def test_lifecycle_misuse_raises() -> None:
    mgr, pool = make_manager(kv_tokens=100, state_slots=4)
    req = Request(array("q", [1, 2, 3]))
    with pytest.raises(ValueError, match="not admitted"):
        mgr.finish(req)
    with pytest.raises(ValueError, match="at least one input token"):
        mgr.admit(Request(array("q")))
    assert mgr.admit(req)
    with pytest.raises(ValueError, match="already admitted"):
        mgr.admit(req)
    with pytest.raises(ValueError, match="cannot extend"):
        mgr.extend(req, 10)
    mgr.abort(req)
    with pytest.raises(ValueError, match="not admitted"):
        mgr.abort(req)
    check_everything(mgr, pool)


def test_jobs_helper_builds_growing_sessions() -> None:
    jobs = multi_turn_jobs(0, sessions=2, turns=3)
    assert len(jobs) >= 6 and all(isinstance(j, Job) for j in jobs)
