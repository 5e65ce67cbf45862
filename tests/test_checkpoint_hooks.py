"""A policy that wraps another passes the scheduler's two hooks on (vLLM's policy
pins blocks in `before_match` and unpins them in `on_abort`: a wrapper that dropped
them leaked pins, as `explain`'s recorder once did on synthetic-agent with `vllm`)."""

from __future__ import annotations

from array import array

from mambaradix.engine.deterministic import GridCheckpoints
from mambaradix.lifecycle import Request
from mambaradix.policies import Policy, SGLang
from mambaradix.replay.explain.observe import Recorder


class Calls(SGLang):
    def __init__(self) -> None:
        self.calls: list[tuple[str, Request]] = []

    def before_match(self, req: Request) -> None:
        self.calls.append(("before_match", req))

    def on_abort(self, req: Request) -> None:
        self.calls.append(("on_abort", req))


def wrappers(inner: Policy) -> list[Policy]:
    return [
        GridCheckpoints(inner, 4),
        Recorder(inner, frozenset(), lambda r: None, lambda r: None),
    ]


def test_every_wrapper_passes_both_hooks_on() -> None:
    for i in range(len(wrappers(Calls()))):
        inner = Calls()
        policy = wrappers(inner)[i]
        a, b = Request(array("q", [1, 2, 3])), Request(array("q", [4, 5]))
        policy.before_match(a)
        policy.on_abort(b)
        policy.before_match(b)
        assert inner.calls == [("before_match", a), ("on_abort", b), ("before_match", b)]


def test_the_base_hooks_do_nothing() -> None:
    req = Request(array("q", [1, 2]))
    before = dict(vars(req))
    SGLang().before_match(req)
    SGLang().on_abort(req)
    assert vars(req) == before
