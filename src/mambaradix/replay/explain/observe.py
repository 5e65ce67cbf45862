"""What a run did, recorded as it happens, for `explain`.

An `Observer` hooks one `ServingModel` before it runs, through the seams the
replay already has, and changes nothing it observes:

* the tree's listener protocol (`add_listener`): every state the tree takes,
  with the path it ends (`held`: everything this tree ever cached);
* the scheduler's checkpoint policy (`Recorder` wraps it): each admission,
  where the request's levels are read (`Seen`, at the moment of its match),
  and each checkpoint the policy's admission refused (`refused`);
* the scheduler's `on_finish` / `on_abort` callbacks: requests that ended
  (`Shared.ended`, and `finished` when served);
* `ServingModel.on_submit`: which scheduler request is which trace request;
* the cache manager's evictor (`CacheManager.evictor`, the policy's): what
  each eviction freed, and for which pool (`evicted`);
* on a tiered run, the model's `TieredCache` (`tiers.TierWatch`): what the
  lower tiers held and each lookup's load-or-recompute decision.

The replay itself never pays for any of it: without an observer none of these
hooks is set.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

from mambaradix.core.keys import common_prefix_len
from mambaradix.core.node import TreeNode
from mambaradix.core.results import EvictResult
from mambaradix.core.tree import MambaRadixCache
from mambaradix.lifecycle import Request
from mambaradix.policies import Policy
from mambaradix.policies.wrap import PolicyWrapper
from mambaradix.replay.explain.attribute import NOTHING_SEEN, Seen
from mambaradix.replay.explain.ideal import Prefixes, computable
from mambaradix.replay.explain.records import Room
from mambaradix.replay.explain.tiers import NO_DECISION, Decision, TierWatch
from mambaradix.replay.serving import ServingModel
from mambaradix.scheduler import Sequence


class Shared:
    """What the instances of one run share: the requests that ended (finished
    or dropped), and, with several instances, what any of them held or
    finished."""

    def __init__(self, requests: int, instances: int) -> None:
        self.ended = Prefixes()
        self.has_ended = [False] * requests
        several = instances > 1
        self.held_anywhere = Prefixes() if several else None
        self.finished_anywhere = Prefixes() if several else None


class Recorder(PolicyWrapper):
    """A `Policy` that answers as the policy it wraps and reports admissions and
    the refusals of the policy's admission."""

    def __init__(
        self,
        inner: Policy,
        admission_kinds: frozenset[str],
        admitted: Callable[[Request], None],
        refused: Callable[[Request], None],
    ) -> None:
        super().__init__(inner)
        self.admission_kinds = admission_kinds
        self._admitted, self._refused = admitted, refused

    @property
    def decode_interval(self) -> int | None:
        return self.inner.decode_interval

    @decode_interval.setter
    def decode_interval(self, value: int | None) -> None:
        self.inner.decode_interval = value

    def cache_at(self, req: Request, kind: str) -> bool:
        ok = self.inner.cache_at(req, kind)
        if not ok and kind in self.admission_kinds:
            self._refused(req)
        return ok

    def on_admitted(self, req: Request) -> None:
        self.inner.on_admitted(req)
        self._admitted(req)


def path_of(node: TreeNode) -> array[int]:
    """The tokens from the root to the end of `node`."""
    keys = []
    while node.parent is not None:
        keys.append(node.key)
        node = node.parent
    out: array[int] = array("q")
    for key in reversed(keys):
        out += key
    return out


class Observer:
    """Records one serving model's run (module docstring). `reach[i]`: the
    bound of trace request i, in units, as far as this engine can hold it;
    `previous[i]`: its session's previous turn (-1: none). After the run,
    `seen[i]` holds request i's levels and hit (units) at its last admission."""

    def __init__(
        self,
        model: ServingModel,
        instance: int,
        shared: Shared,
        reach: list[int],
        previous: list[int],
    ) -> None:
        self.model, self.instance, self.shared = model, instance, shared
        self.reach, self.previous = reach, previous
        self.tiers = None if model.tiered is None else TierWatch(model.tiered)
        self.requests = model.trace.requests
        self.held = Prefixes()  # every path this tree ever ended at a state
        self.refused = Prefixes()  # every checkpoint its policy's admission refused
        self.finished = Prefixes()  # what the requests it served could leave cached
        self.index: dict[Request, int] = {}
        self.seen: dict[int, tuple[Seen, int]] = {}
        self.evicted = {why: [0, 0] for why in Room}
        """Per pool an eviction made room in: [KV units, states] it freed (a leaf
        whose state goes takes its KV with it; a KV leaf, its state)."""
        self._hook(model)

    def _hook(self, model: ServingModel) -> None:
        model.on_submit = self._submitted
        model.cache.tree.add_listener(self)
        sched = model.scheduler
        kinds = model.policy.admission_kinds
        sched.checkpoints = Recorder(sched.checkpoints, kinds, self._admitted, self._refused)
        finish, abort = sched.on_finish, sched.on_abort
        assert finish is not None and abort is not None, "the serving model sets both"

        def finished(seq: Sequence) -> None:
            finish(seq)
            self._ended(seq.id, served=True)

        def aborted(seq: Sequence) -> None:
            abort(seq)
            self._ended(seq.id, served=False)

        sched.on_finish, sched.on_abort = finished, aborted
        evictor = model.cache.evictor

        def evict(tree: MambaRadixCache, kv_units: int, states: int) -> EvictResult:
            r = evictor(tree, kv_units, states)
            why = Room.BOTH if kv_units and states else Room.KV if kv_units else Room.STATES
            self.evicted[why][0] += len(r.freed_kv)
            self.evicted[why][1] += len(r.freed_states)
            return r

        model.cache.evictor = evict

    # ----------------------------------------------------- scheduler events

    def _submitted(self, i: int, seq: Sequence) -> None:
        self.index[seq.req] = i

    def _refused(self, req: Request) -> None:
        self.refused.add(req.tokens[: req.computed])

    def _ended(self, i: int, served: bool) -> None:
        seq = computable(self.requests[i])
        shared = self.shared
        shared.ended.add(seq)
        shared.has_ended[i] = True
        if served:
            self.finished.add(seq)
            if shared.finished_anywhere is not None:
                shared.finished_anywhere.add(seq)

    def _admitted(self, req: Request) -> None:
        """The request matched `req.cached_len` units (`req.kv_hit_len` of KV):
        read every level now, before anything else is cached or evicted."""
        i = self.index[req]
        hit, reach = req.cached_len, self.reach[i]
        below = NO_DECISION if self.tiers is None else self.tiers.decision(req)
        seen = NOTHING_SEEN if hit >= reach else self._levels(i, req, reach, below)
        self.seen[i] = (seen, hit)

    def _levels(self, i: int, req: Request, reach: int, below: Decision) -> Seen:
        key = self.requests[i].input_units[:reach]
        held = self.held.tree.match_prefix(key, read_only=True)
        here = max(held.kv_hit_len, self.finished.common(key))
        shared = self.shared
        elsewhere = here
        if shared.held_anywhere is not None and shared.finished_anywhere is not None:
            elsewhere = max(shared.held_anywhere.common(key), shared.finished_anywhere.common(key))
        kv = min(req.kv_hit_len, reach)
        ever_below, state_below = (0, 0) if self.tiers is None else self.tiers.below_levels(key)
        return Seen(
            session=self._session(i, key),
            ended=shared.ended.common(key),
            elsewhere=elsewhere,
            here=here,
            refused=self.refused.deepest_end(key),
            ever_state=held.prefix_len,
            kept_kv=self.held.deepest_end(key[:kv]),
            ever_below=ever_below,
            state_below=state_below,
            lower_tier=below.deepest,
            recompute=below.deepest if below.declined else 0,
            failed=below.failed,
        )

    def _session(self, i: int, key: array[int]) -> int:
        """How far its session's previous turn holds `key`, if that turn has not ended."""
        prev = self.previous[i]
        if prev < 0 or self.shared.has_ended[prev]:
            return 0
        return common_prefix_len(computable(self.requests[prev]), key, 0)

    # ------------------------------------------------------- TreeListener

    def state_added(self, node: TreeNode) -> None:
        path = path_of(node)
        self.held.add(path)
        if self.shared.held_anywhere is not None:
            self.shared.held_anywhere.add(path)

    def node_added(self, node: TreeNode) -> None:
        pass

    def node_split(self, upper: TreeNode, lower: TreeNode) -> None:
        pass

    def node_removed(self, node: TreeNode) -> None:
        pass

    def state_removed(self, node: TreeNode) -> None:
        pass

    def tree_reset(self) -> None:
        pass
