"""A hybrid-aware KV indexer: per worker, the KV overlap and the usable prefix of a prompt.

Blocks of `block_size` tokens form one trie shared by all workers (keyed by the block's
tokens, as Dynamo's indexer keys by a hash of them); each trie node records which workers
hold its KV and which hold a recurrent state at its end. A worker's own block hashes only
name its blocks for removal and for finding a new block's parent.

Per prompt and worker (`query`):

* `longest_matched`: tokens in the contiguous run of the prompt's full blocks that the
  worker holds from the start (the KV overlap Dynamo reports);
* `usable`: the deepest block end p <= longest_matched where the worker holds a state,
  with p <= len(prompt) - 1 (one token must be prefilled); for an attention-only worker
  (no recurrent state) every block end counts;
* `tail_recompute = longest_matched - usable`.

Which events count (`apply`): `BlockStored` of a full-prefix attention kind (or of no
kind, as SGLang sends, in group 0 or no group) places KV blocks; of kind "mamba" it marks
states; a state store may name fewer blocks than its tokens span (vLLM's align mode keeps
states at some blocks only): each hash is the block it names, found among the worker's
blocks, so only those states are credited. A block whose parent the worker never
stored (on any tier) is not placed (and not credited). A block whose hashes depend on
more than its tokens (a LoRA adapter, a cache salt: `namespace`) is not placed: a query
by token ids cannot name it. A removal names a group; its kind is the one that group's
stores carried, and a removal of an unknown group drops the KV (and so the state). One
block (parent and tokens) stored under several hashes (vLLM adds extra keys, an image's
hash, to a block's) is held until every one of them is removed.

Tiers (`medium`): every event names the tier it is about, DEVICE (or unset), HOST or
DISK, and each tier is kept apart: per worker and tier, the blocks whose KV it holds and
the blocks with a state at their end. A block removed from the device but stored on the
host is still held on the host. A block is placed by its tokens (any tier) or, for a
store with hashes alone (vLLM's offload placeholder), by a hash the worker holds on some
tier (else it is counted in `worker_info`'s "media" and not credited). A state needs
only its block to be known (its KV may sit on another tier: a state demoted to host
memory while its KV stays on the device); removing a block's KV from a tier drops the
state there on that tier, and a block the worker holds on no tier loses its states on
every tier. `query` answers from the device alone, as before; `query_tiers` answers per
tier, cumulatively (the rules are in its docstring).
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

from mambaradix.events.model import (
    DEVICE,
    DISK,
    FULL_PREFIX_KINDS,
    HOST,
    MEDIA,
    STATE_KINDS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    check_block_size,
)
from mambaradix.names import Names
from mambaradix.results import JsonResult

log = logging.getLogger("mambaradix.index")


class Role(Names):
    """What a stored block is to the indexer, by its group's kind: prefix KV, a
    recurrent state, another kind (skipped), or a group whose kind is not known yet."""

    KV = "kv"
    STATE = "state"
    OTHER = "other"
    UNKNOWN = "unknown"


_KV, _STATE, _OTHER, _UNKNOWN = Role
_MAX_PENDING_STATES = 1 << 16


_NO_CHILDREN: Mapping[bytes, _Block] = MappingProxyType({})  # shared and read-only
_NO_STATES: frozenset[int] = frozenset()
_LOWER = (HOST, DISK)
_RANK = {DEVICE: 0, HOST: 1, DISK: 2}  # tiers, fastest first
_ABSENT = 3  # a rank: held on no tier


class _Low:
    """A block's residency on the lower tiers: per medium, the workers holding its KV
    and those holding a state at its end (made when a block first reaches one)."""

    __slots__ = ("kv", "states")

    def __init__(self) -> None:
        self.kv: dict[str, set[int]] = {HOST: set(), DISK: set()}
        self.states: dict[str, set[int]] = {HOST: set(), DISK: set()}

    def holds(self, worker_id: int) -> bool:
        return worker_id in self.kv[HOST] or worker_id in self.kv[DISK]

    def empty(self) -> bool:
        return not (self.kv[HOST] or self.kv[DISK])


class _Block:
    __slots__ = ("parent", "key", "children", "kv", "states", "low")

    def __init__(self, parent: _Block | None, key: bytes) -> None:
        self.parent = parent
        self.key = key  # the block's tokens, int64 native bytes
        # Most blocks are leaves without states: they share empty read-only containers
        # until they need their own (a new node then costs one set, not three containers).
        self.children: Mapping[bytes, _Block] = _NO_CHILDREN
        self.kv: set[int] = set()  # workers holding this block's KV (with all before it)
        self.states: AbstractSet[int] = _NO_STATES  # workers with a state at its end
        self.low: _Low | None = None  # residency on HOST and DISK (None: none ever)

    def add_child(self, key: bytes) -> _Block:
        if self.children is _NO_CHILDREN:
            self.children = {}
        node = _Block(self, key)
        cast(dict[bytes, _Block], self.children)[key] = node
        return node

    def add_state(self, worker_id: int) -> None:
        if self.states:
            cast(set[int], self.states).add(worker_id)
        else:
            self.states = {worker_id}

    def drop_state(self, worker_id: int) -> None:
        if self.states:
            cast(set[int], self.states).discard(worker_id)

    def lower(self) -> _Low:
        if self.low is None:
            self.low = _Low()
        return self.low

    def rank_kv(self, worker_id: int) -> int:
        """The fastest tier holding the worker's KV of this block (_ABSENT: none)."""
        if worker_id in self.kv:
            return 0
        low = self.low
        if low is None:
            return _ABSENT
        return 1 if worker_id in low.kv[HOST] else 2 if worker_id in low.kv[DISK] else _ABSENT

    def rank_state(self, worker_id: int) -> int:
        """The fastest tier holding the worker's state at this block's end."""
        if worker_id in self.states:
            return 0
        low = self.low
        if low is None:
            return _ABSENT
        s = low.states
        return 1 if worker_id in s[HOST] else 2 if worker_id in s[DISK] else _ABSENT


class _Ahead:
    """A worker's blocks whose hashes also cover the tokens after them (vLLM 0.33 with
    EAGLE hashes `lookahead_token_ids`): vLLM reuses such a block only where the prompt
    goes on with those tokens. Per hash, its node and lookahead; per node, how many of
    its hashes carry each lookahead (one block can be cached once per continuation)."""

    __slots__ = ("of", "at")

    def __init__(self) -> None:
        self.of: dict[int, tuple[_Block, bytes]] = {}
        self.at: dict[_Block, dict[bytes, int]] = {}

    def add(self, h: int, node: _Block, tokens: bytes) -> None:
        self.discard(h)
        self.of[h] = (node, tokens)
        counts = self.at.setdefault(node, {})
        counts[tokens] = counts.get(tokens, 0) + 1

    def discard(self, h: int) -> None:
        got = self.of.pop(h, None)
        if got is not None:
            node, tokens = got
            counts = self.at[node]
            counts[tokens] -= 1
            if not counts[tokens]:
                del counts[tokens]
                if not counts:
                    del self.at[node]

    def allows(self, node: _Block, data: bytes, at: int) -> bool:
        """Whether the prompt `data` (int64 bytes) goes on at byte `at` as one of the
        node's lookaheads says (a node stored without one always does)."""
        counts = self.at.get(node)
        return counts is None or any(data[at : at + len(t)] == t for t in counts)

    def clear(self) -> None:
        self.of.clear()
        self.at.clear()


class _Tier:
    """A worker's blocks on one lower tier, as `_Worker` keeps its device blocks."""

    __slots__ = ("blocks", "aliases", "pending_states")

    def __init__(self) -> None:
        self.blocks: dict[int, _Block] = {}  # hash -> trie node
        self.aliases: dict[_Block, int] = {}  # node -> how many more hashes name it
        self.pending_states: set[int] = set()  # states on this tier, block not yet known


class _Worker:
    __slots__ = (
        "id",
        "hybrid",
        "blocks",
        "aliases",
        "pending_states",
        "group_kinds",
        "skipped",
        "media",
        "ahead",
        "low",
    )

    def __init__(self, worker_id: int, hybrid: bool) -> None:
        self.id = worker_id
        self.hybrid = hybrid
        self.blocks: dict[int, _Block] = {}  # the worker's block hash -> trie node
        # node -> how many more of the worker's hashes name it (vLLM's extra keys give
        # the same tokens other hashes): it is held until the last one is removed
        self.aliases: dict[_Block, int] = {}
        self.pending_states: set[int] = set()  # states announced before their KV
        self.group_kinds: dict[int, str] = {}  # group_idx -> kv_cache_spec_kind
        self.skipped: dict[str, int] = {}  # why events were not applied, and how often
        # Blocks on a lower tier: (medium, "kv" or "state") -> the hashes held there,
        # placed in the trie or not (counted by `worker_info`)
        self.media: dict[tuple[str, str], set[int]] = {}
        self.ahead = _Ahead()
        self.low = {HOST: _Tier(), DISK: _Tier()}  # placed in the trie

    def named(self, h: int) -> _Block | None:
        """The block the worker's hash `h` names on any tier (None: no tier holds it)."""
        node = self.blocks.get(h)
        if node is None:
            node = self.low[HOST].blocks.get(h) or self.low[DISK].blocks.get(h)
        return node

    def pending_low(self) -> bool:
        return bool(self.low[HOST].pending_states or self.low[DISK].pending_states)


@dataclass(frozen=True, slots=True)
class Overlap:
    longest_matched: int
    usable: int
    tail_recompute: int


class _TierWalk:
    """One walk down the prompt's blocks answering every tier up to `top` at once, as
    `query` does for the device: per tier t, the workers whose run of blocks held on t
    or a faster tier goes on (`active[t]`), where each stopped (`matched[t]`), its
    deepest state on t or faster within `cap` (`state_end[t]`); per worker, the blocks
    of its run that are not on the device (`off`: depth after the block, fastest tier)."""

    def __init__(self, workers: set[int], top: int) -> None:
        self.top = top
        self.active = [set(workers) for _ in range(top + 1)]
        self.matched = [dict.fromkeys(workers, 0) for _ in range(top + 1)]
        self.state_end = [dict.fromkeys(workers, 0) for _ in range(top + 1)]
        self.off: dict[int, list[tuple[int, int]]] = {}
        self.path: list[_Block] = []
        self.depth = 0

    def step(self, child: _Block, size: int, cap: int) -> bool:
        """Go down to `child` (False: no worker holds it on any tier asked for)."""
        low, kv, actives, depth = child.low, child.kv, self.active, self.depth
        layers: list[AbstractSet[int]]
        if low is None:
            layers = [kv] * len(actives)
        else:
            host = kv | low.kv[HOST]
            layers = [kv, host, host | low.kv[DISK]]
        going = False
        for t, active in enumerate(actives):
            if active and not active <= layers[t]:
                held = active & layers[t]
                matched = self.matched[t]
                for w in active - held:
                    matched[w] = depth
                actives[t] = active = held
            going = going or bool(active)
        if not going:
            return False
        self.depth = depth = depth + size
        self.path.append(child)
        if low is None:
            if child.states and depth <= cap:
                self._states([child.states] * len(actives))
            return True
        top = actives[-1]
        if not top <= kv:
            for w in top - kv:
                rank = 1 if w in low.kv[HOST] else 2
                self.off.setdefault(w, []).append((depth, rank))
        if depth <= cap and (child.states or low.states[HOST] or low.states[DISK]):
            host = set(child.states) | low.states[HOST]
            self._states([child.states, host, host | low.states[DISK]])
        return True

    def _states(self, states: list[AbstractSet[int]]) -> None:
        """Workers still matched at tier t with a state here on t or faster (by tier)."""
        for t, active in enumerate(self.active):
            if states[t] and active:
                for w in states[t] & active:
                    self.state_end[t][w] = self.depth

    def end(self) -> None:
        for t in range(self.top + 1):
            for w in self.active[t]:
                self.matched[t][w] = self.depth


@dataclass(frozen=True, slots=True)
class TierOverlap:
    """One worker's answer for one tier T, counting what it holds on T and every faster
    tier. `load`: tokens of the usable prefix whose KV is not on the device, per tier it
    comes from (the fastest holding each block); `state_medium`: the fastest tier holding
    the state at `usable` (None when nothing is usable, or for an attention-only worker)."""

    longest_matched: int
    usable: int
    tail_recompute: int
    load: Mapping[str, int]
    state_medium: str | None


@dataclass(frozen=True, eq=False)
class WorkerInfo(JsonResult):
    """One worker as the indexer holds it: its blocks, the states among them, the
    events skipped (reason -> count) and the blocks on lower tiers (medium -> role ->
    count). Attribute access is the typed way to read it; it is also the read-only
    mapping over its JSON keys (`mambaradix.results`)."""

    instance_id: int
    hybrid: bool
    blocks: int
    states: int
    skipped: dict[str, int]
    media: dict[str, dict[str, int]]


class Indexer:
    """Feed events per worker with `apply` (in order); ask with `query` (the device) or
    `query_tiers` (per tier)."""

    def __init__(self, block_size: int, hybrid: bool = True) -> None:
        check_block_size(block_size)
        _check_hybrid(hybrid)
        self.block_size = block_size
        self.default_hybrid = hybrid
        self._root = _Block(None, b"")
        self._workers: dict[int, _Worker] = {}

    # ------------------------------------------------------------------ workers

    def add_worker(self, worker_id: int, hybrid: bool | None = None) -> None:
        """Register a worker (done implicitly by its first event). `hybrid=False`: an
        attention-only model, whose every cached block end is usable."""
        check_worker_id(worker_id)
        if hybrid is not None:
            _check_hybrid(hybrid)
        if worker_id in self._workers:
            raise ValueError(f"worker {worker_id} is already registered")
        self._workers[worker_id] = _Worker(
            worker_id, self.default_hybrid if hybrid is None else hybrid
        )

    def remove_worker(self, worker_id: int) -> None:
        self.clear_worker(worker_id)
        del self._workers[worker_id]

    def clear_worker(self, worker_id: int) -> None:
        """Forget everything the worker holds (it stays registered)."""
        w = self._worker(worker_id)
        if any(t.blocks or t.pending_states for t in w.low.values()):
            return self._clear_tiers(w)
        for node in w.blocks.values():
            self._drop(w.id, node)
        w.blocks.clear()
        w.aliases.clear()
        w.pending_states.clear()
        w.media.clear()
        w.ahead.clear()
        return None

    def _clear_tiers(self, w: _Worker) -> None:
        """`clear_worker` for a worker with blocks on lower tiers: every mark goes first,
        then the nodes nobody holds are pruned."""
        nodes = set(w.blocks.values())
        for tier in w.low.values():
            nodes.update(tier.blocks.values())
            tier.blocks.clear()
            tier.aliases.clear()
            tier.pending_states.clear()
        for node in nodes:
            node.kv.discard(w.id)
            node.drop_state(w.id)
            if node.low is not None:
                for medium in _LOWER:
                    node.low.kv[medium].discard(w.id)
                    node.low.states[medium].discard(w.id)
        for node in nodes:
            _prune(node)
        w.blocks.clear()
        w.aliases.clear()
        w.pending_states.clear()
        w.media.clear()
        w.ahead.clear()

    def worker_ids(self) -> list[int]:
        return sorted(self._workers)

    def worker_info(self, worker_id: int) -> WorkerInfo:
        w = self._worker(worker_id)
        states = sum(1 for node in w.blocks.values() if w.id in node.states)
        media: dict[str, dict[str, int]] = {}
        for (medium, role), hashes in w.media.items():
            if hashes:
                media.setdefault(medium, {})[role] = len(hashes)
        return WorkerInfo(w.id, w.hybrid, len(w.blocks), states, dict(w.skipped), media)

    def _worker(self, worker_id: int) -> _Worker:
        w = self._workers.get(worker_id)
        if w is None:
            raise KeyError(f"unknown worker {worker_id}")
        return w

    # ------------------------------------------------------------------- events

    def apply(self, worker_id: int, events: Iterable[Event]) -> None:
        """Apply a worker's events, oldest first (registers the worker if new)."""
        if not isinstance(events, Iterable):
            raise TypeError(f"events must be an iterable of events, got {type(events).__name__}")
        w = self._workers.get(worker_id)
        if w is None:
            self.add_worker(worker_id)
            w = self._workers[worker_id]
        for event in events:
            if isinstance(event, BlockStored):
                self._stored(w, event)
            elif isinstance(event, BlockRemoved):
                self._removed(w, event)
            elif isinstance(event, AllBlocksCleared):
                self.clear_worker(w.id)
            else:
                _skip(w, "not an event")

    def _stored(self, w: _Worker, e: BlockStored) -> None:
        group, kind = e.group, e.kind
        if group is not None and kind is not None:
            w.group_kinds[group] = kind
        if kind in FULL_PREFIX_KINDS or (kind is None and group is None):  # the common cases
            role = _KV
        else:
            role = self._role(w, group, kind)
        if e.namespace is not None:
            return _skip(w, f"namespaced ({e.namespace})")
        if e.medium not in (None, DEVICE):
            if self._lower(w, e.medium, role, e.block_hashes, True):
                self._stored_low(w, e, e.medium, role)
            return None
        if e.block_size != self.block_size:
            return _skip(w, f"block_size {e.block_size}")
        if role == _KV:
            self._place(w, e)
        elif role == _STATE:
            for h in e.block_hashes:
                node = w.blocks.get(h) or w.named(h)
                if node is not None:
                    node.add_state(w.id)
                elif len(w.pending_states) < _MAX_PENDING_STATES:
                    w.pending_states.add(h)
        else:
            _skip(w, f"group {e.group} kind {e.kind}")
        return None

    def _place(self, w: _Worker, e: BlockStored) -> None:
        if e.parent_block_hash is None:
            parent = self._root
        else:
            found = w.blocks.get(e.parent_block_hash) or w.named(e.parent_block_hash)
            if found is None:
                log.debug("worker %s: parent of %s never stored", w.id, e.block_hashes[0])
                return _skip(w, "parent never stored")
            parent = found
        try:
            data = array("q", e.token_ids).tobytes()
            ahead = [array("q", x).tobytes() for x in e.lookahead] if e.lookahead else None
        except (TypeError, OverflowError):
            return _skip(w, "token_ids not int64")
        step, blocks, pending, wid = 8 * self.block_size, w.blocks, w.pending_states, w.id
        pending_low = w.pending_low()
        start = 0
        for h in e.block_hashes:
            key = data[start : start + step]
            start += step
            node = parent.children.get(key)
            if node is None:
                node = parent.add_child(key)
            old = blocks.get(h)
            if old is not node:
                if old is not None:
                    self._release(w, old)
                if wid in node.kv:
                    w.aliases[node] = w.aliases.get(node, 0) + 1
            blocks[h] = node
            node.kv.add(wid)
            if pending and h in pending:
                pending.discard(h)
                node.add_state(wid)
            if pending_low:
                _resolve_low(w, h, node)
            parent = node
        if ahead is not None or w.ahead.of:  # lookaheads to note, or to forget
            for i, h in enumerate(e.block_hashes):
                if ahead is not None:
                    w.ahead.add(h, blocks[h], ahead[i])
                else:
                    w.ahead.discard(h)
        return None

    def _lower(
        self, w: _Worker, medium: str, role: Role, hashes: Iterable[int], stored: bool
    ) -> bool:
        """Blocks stored on (or removed from) a lower tier: counted by hash, per medium
        (False: skipped, an unknown medium or role). A removal of an unknown group drops
        both roles, as on the device."""
        roles = (_KV, _STATE) if role == _UNKNOWN and not stored else (role,)
        if medium not in (HOST, DISK):
            _skip(w, f"medium {medium}")
            return False
        if roles[0] not in (_KV, _STATE):
            _skip(w, f"medium {medium} role {role}")
            return False
        for r in roles:
            held = w.media.setdefault((medium, r), set())
            if stored:
                held.update(hashes)
            else:
                held.difference_update(hashes)
        return True

    def _stored_low(self, w: _Worker, e: BlockStored, medium: str, role: Role) -> None:
        """A store on HOST or DISK, placed in the trie: KV by its tokens under its parent
        (any tier), a placeholder (hashes alone) or a state by the blocks its hashes name."""
        tier = w.low[medium]
        placeholder = e.block_size == 0 and not e.token_ids
        if not placeholder and e.block_size != self.block_size:
            return _skip(w, f"block_size {e.block_size}")
        if role == _STATE:
            for h in e.block_hashes:
                node = w.named(h)
                if node is not None:
                    node.lower().states[medium].add(w.id)
                elif len(tier.pending_states) < _MAX_PENDING_STATES:
                    tier.pending_states.add(h)
            return None
        if placeholder:
            for h in e.block_hashes:
                node = w.named(h)
                if node is not None:  # else counted in "media" only
                    self._hold_low(w, tier, medium, h, node)
            return None
        parent = self._root
        if e.parent_block_hash is not None:
            found = w.named(e.parent_block_hash)
            if found is None:
                return _skip(w, "parent never stored")
            parent = found
        try:
            data = array("q", e.token_ids).tobytes()
        except (TypeError, OverflowError):
            return _skip(w, "token_ids not int64")
        step = 8 * self.block_size
        for i, h in enumerate(e.block_hashes):
            key = data[i * step : (i + 1) * step]
            node = parent.children.get(key) or parent.add_child(key)
            self._hold_low(w, tier, medium, h, node)
            parent = node
        return None

    def _hold_low(self, w: _Worker, tier: _Tier, medium: str, h: int, node: _Block) -> None:
        """The worker's hash `h` names `node` on `medium` (as `_place` does on the device)."""
        old = tier.blocks.get(h)
        if old is not node:
            held = node.lower().kv[medium]
            if w.id in held:
                tier.aliases[node] = tier.aliases.get(node, 0) + 1
            held.add(w.id)
            tier.blocks[h] = node
            if old is not None:
                self._release_low(w, tier, medium, old)
        if w.pending_states and h in w.pending_states:
            w.pending_states.discard(h)
            node.add_state(w.id)
        _resolve_low(w, h, node)

    def _release_low(self, w: _Worker, tier: _Tier, medium: str, node: _Block) -> None:
        """One of the worker's hashes for `node` on `medium` is gone: if that was the
        last, the block leaves the tier with its state there."""
        more = tier.aliases.pop(node, 0)
        if more > 1:
            tier.aliases[node] = more - 1
        elif not more:
            low = node.lower()
            low.kv[medium].discard(w.id)
            low.states[medium].discard(w.id)
            _forget_if_gone(w.id, node)
            _prune(node)

    def _removed_low(self, w: _Worker, e: BlockRemoved, medium: str, role: Role) -> None:
        tier = w.low[medium]
        for h in e.block_hashes:
            tier.pending_states.discard(h)
            if role == _STATE:
                node = w.named(h)
                if node is not None and node.low is not None:
                    node.low.states[medium].discard(w.id)
            else:  # KV, or an unknown group: the KV, and with it the state there
                node = tier.blocks.pop(h, None)
                if node is not None:
                    self._release_low(w, tier, medium, node)

    def _removed(self, w: _Worker, e: BlockRemoved) -> None:
        role = self._role(w, e.group, None)
        if e.medium not in (None, DEVICE):
            if self._lower(w, e.medium, role, e.block_hashes, False):
                self._removed_low(w, e, e.medium, role)
            return None
        for h in e.block_hashes:
            if role == _STATE:
                w.pending_states.discard(h)
                node = w.blocks.get(h) or w.named(h)
                if node is not None:
                    node.drop_state(w.id)
            elif role in (_KV, _UNKNOWN):
                w.pending_states.discard(h)
                w.ahead.discard(h)
                gone = w.blocks.pop(h, None)
                if gone is not None:
                    self._release(w, gone)
        return None

    def _role(self, w: _Worker, group: int | None, kind: str | None) -> Role:
        if kind is None and group is not None:
            kind = w.group_kinds.get(group)
        if kind is None:
            return _KV if group in (None, 0) else _UNKNOWN
        if kind in FULL_PREFIX_KINDS:
            return _KV
        return _STATE if kind in STATE_KINDS else _OTHER

    def _release(self, w: _Worker, node: _Block) -> None:
        """One of the worker's hashes for `node` is gone: drop it if that was the last."""
        more = w.aliases.pop(node, 0)
        if more > 1:
            w.aliases[node] = more - 1
        elif not more:
            self._drop(w.id, node)

    def _drop(self, worker_id: int, node: _Block) -> None:
        """Take the worker off `node`, then prune nodes nobody holds (a node met twice,
        under two hashes, is pruned once)."""
        node.kv.discard(worker_id)
        node.drop_state(worker_id)
        if node.low is not None:
            _forget_if_gone(worker_id, node)
        _prune(node)

    # -------------------------------------------------------------------- query

    def query(self, token_ids: Any) -> dict[int, Overlap]:
        """Per registered worker, what it holds of the prompt `token_ids`."""
        tokens = _prompt(token_ids)
        size = self.block_size
        cap = (len(tokens) - 1) // size * size if tokens else 0
        matched = dict.fromkeys(self._workers, 0)
        state_end = dict.fromkeys(self._workers, 0)
        active = set(self._workers)
        data, step, node, depth = tokens.tobytes(), 8 * size, self._root, 0
        # the prompt's blocks in the trie as far as any worker matched, kept only when a
        # worker has lookahead hashes (see `_cut`)
        path: list[_Block] | None = [] if any(w.ahead.at for w in self._workers.values()) else None
        for k in range(len(tokens) // size):
            child = node.children.get(data[k * step : (k + 1) * step])
            if child is None:
                break
            if not active <= child.kv:  # some workers stop here
                held = active & child.kv
                for w in active - held:
                    matched[w] = depth
                active = held
                if not active:
                    break
            depth += size
            if child.states and depth <= cap:
                for w in child.states & active:
                    state_end[w] = depth
            node = child
            if path is not None:
                path.append(node)
        for w in active:
            matched[w] = depth
        for wid, worker in self._workers.items():
            if path is not None and worker.ahead.at and matched[wid]:
                matched[wid], state_end[wid] = self._cut(worker, path, data, matched[wid], cap)
        return {w: self._overlap(w, matched[w], state_end[w], cap) for w in matched}

    def _cut(
        self, w: _Worker, path: list[_Block], data: bytes, matched: int, cap: int
    ) -> tuple[int, int]:
        """The match of a worker with lookahead hashes, cut back past blocks whose
        lookahead the prompt does not go on with, and the deepest state within it. (A
        block followed by a matched block passed that block's tokens as its lookahead
        when it was stored, so only the last one is in doubt; it is checked again after
        each cut.)"""
        size = self.block_size
        matched = self._cut_matched(w, path, data, matched)
        state = min(matched, cap) // size * size
        while state and w.id not in path[state // size - 1].states:
            state -= size
        return matched, state

    def _cut_matched(self, w: _Worker, path: list[_Block], data: bytes, matched: int) -> int:
        size = self.block_size
        while matched and not w.ahead.allows(path[matched // size - 1], data, 8 * matched):
            matched -= size
        return matched

    def query_tiers(self, token_ids: Any, media: Any = MEDIA) -> dict[int, dict[str, TierOverlap]]:
        """Per registered worker and per tier T in `media` (DEVICE, HOST, DISK), what it
        can reuse of the prompt from T and the tiers faster than T, loading what is not
        on the device:

        * `longest_matched`: tokens in the contiguous run of the prompt's full blocks
          from the start whose KV the worker holds on T or a faster tier (each block
          on any of them: a block on the device, the next on the host, is a match);
        * `usable`: the deepest block end p <= longest_matched, p <= len(prompt) - 1,
          with the worker's state at p on T or a faster tier (any block end for an
          attention-only worker): KV on the device and the state on the host is usable
          from HOST on, with a load;
        * `tail_recompute`, `load` and `state_medium` (see `TierOverlap`).

        So the answers grow from DEVICE to DISK, and DEVICE's equals `query`'s."""
        tiers = check_media(media)
        tokens = _prompt(token_ids)
        size = self.block_size
        cap = (len(tokens) - 1) // size * size if tokens else 0
        top = max(_RANK[m] for m in tiers)
        walk = _TierWalk(set(self._workers), top)
        data, step, node, go = tokens.tobytes(), 8 * size, self._root, walk.step
        for k in range(len(tokens) // size):
            child = node.children.get(data[k * step : (k + 1) * step])
            if child is None or not go(child, size, cap):
                break
            node = child
        walk.end()
        out: dict[int, dict[str, TierOverlap]] = {}
        for wid, w in self._workers.items():
            out[wid] = {m: self._tier_answer(w, walk, data, cap, _RANK[m]) for m in tiers}
        return out

    def _tier_answer(
        self, w: _Worker, walk: _TierWalk, data: bytes, cap: int, t: int
    ) -> TierOverlap:
        size, wid, path = self.block_size, w.id, walk.path
        matched, state = walk.matched[t][wid], walk.state_end[t][wid]
        if w.ahead.at and matched:
            matched = self._cut_matched(w, path, data, matched)
            state = min(matched, cap) // size * size
            while state and path[state // size - 1].rank_state(wid) > t:
                state -= size
        usable = state if w.hybrid else min(matched, cap)
        load: dict[str, int] = {}
        for depth, rank in walk.off.get(wid, ()):
            if depth > usable:
                break
            load[MEDIA[rank]] = load.get(MEDIA[rank], 0) + size
        state_medium = None
        if w.hybrid and usable:
            state_medium = MEDIA[path[usable // size - 1].rank_state(wid)]
        return TierOverlap(matched, usable, matched - usable, load, state_medium)

    def _overlap(self, worker_id: int, matched: int, state_end: int, cap: int) -> Overlap:
        usable = state_end if self._workers[worker_id].hybrid else min(matched, cap)
        return Overlap(matched, usable, matched - usable)

    # --------------------------------------------------------------------- dump

    def dump(self, worker_id: int) -> list[Event]:
        """Events that rebuild what the worker holds: `AllBlocksCleared`, then its blocks
        parents first, each per tier that holds it (device, host, disk), then the
        states it holds at its end per tier."""
        w = self._worker(worker_id)
        names = [{id(node): h for h, node in blocks.items()} for blocks in self._maps(w)]
        out: list[Event] = [AllBlocksCleared()]
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            held = [i for i, name in enumerate(names) if id(node) in name]
            if not held:
                continue
            up = node.parent
            parent = None if up is self._root or up is None else _any_name(names, up)
            tokens = array("q")
            tokens.frombytes(node.key)
            block = (tuple(tokens), self.block_size)
            for i in held:
                out.append(BlockStored((names[i][id(node)],), parent, *block, medium=MEDIA[i]))
            h = _any_name(names, node)
            for i, medium in enumerate(MEDIA):
                if _state_on(node, w.id, i):
                    out.append(BlockStored((h,), parent, *block, 1, "mamba", medium))
            stack.extend(node.children.values())
        return out

    def _maps(self, w: _Worker) -> list[dict[int, _Block]]:
        """The worker's hash -> block maps, per tier (device, host, disk)."""
        return [w.blocks, w.low[HOST].blocks, w.low[DISK].blocks]

    # ------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """Raise AssertionError unless the trie and every worker's maps agree: each hash
        names a node in the trie holding the worker on that tier, each node holding a
        worker on a tier is named there (aliases counted), a state sits only on a block
        the worker holds on some tier, and no node is held by nobody without children."""
        seen: set[int] = set()
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            seen.add(id(node))
            assert node.parent is not None and node.parent.children[node.key] is node
            assert node.children or node.kv or (node.low is not None and not node.low.empty())
            stack.extend(node.children.values())
        for w in self._workers.values():
            self._check_worker(w, seen)

    def _check_worker(self, w: _Worker, seen: set[int]) -> None:
        held: set[_Block] = set()
        for i, (blocks, aliases) in enumerate(
            [(w.blocks, w.aliases)] + [(w.low[m].blocks, w.low[m].aliases) for m in _LOWER]
        ):
            count: dict[_Block, int] = {}
            for node in blocks.values():
                assert id(node) in seen, f"worker {w.id}: a hash names a pruned block"
                assert _kv_on(node, w.id, i), (w.id, i)
                count[node] = count.get(node, 0) + 1
            assert {n: c - 1 for n, c in count.items() if c > 1} == aliases, w.id
            held.update(count)
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            for i in range(len(MEDIA)):
                if _kv_on(node, w.id, i):
                    assert node in held and node in self._named_on(w, i), (w.id, i)
                if _state_on(node, w.id, i):
                    assert node in held, f"worker {w.id}: a state on a block held nowhere"
            stack.extend(node.children.values())

    def _named_on(self, w: _Worker, tier: int) -> set[_Block]:
        return set(self._maps(w)[tier].values())


def _skip(w: _Worker, why: str) -> None:
    w.skipped[why] = w.skipped.get(why, 0) + 1


def _kv_on(node: _Block, worker_id: int, tier: int) -> bool:
    if tier == 0:
        return worker_id in node.kv
    return node.low is not None and worker_id in node.low.kv[MEDIA[tier]]


def _state_on(node: _Block, worker_id: int, tier: int) -> bool:
    if tier == 0:
        return worker_id in node.states
    return node.low is not None and worker_id in node.low.states[MEDIA[tier]]


def _any_name(names: list[dict[int, int]], node: _Block) -> int:
    """A hash naming `node` on some tier, the device's first."""
    return next(name[id(node)] for name in names if id(node) in name)


def _prompt(token_ids: Any) -> array[int]:
    if isinstance(token_ids, (Mapping, AbstractSet)):  # no order: not a prompt
        raise TypeError(f"token_ids must be a sequence, got {type(token_ids).__name__}")
    if isinstance(token_ids, (bytes, bytearray)):  # array() would read raw memory
        token_ids = list(token_ids)
    try:
        return array("q", token_ids)
    except (TypeError, OverflowError):
        raise TypeError("token_ids must be a sequence of 64-bit ints") from None


def _prune(node: _Block) -> None:
    """Remove `node` and its ancestors while nobody holds them on any tier and they have
    no children (a node met twice, under two hashes, is pruned once)."""
    x: _Block | None = node
    while (
        x is not None
        and x.parent is not None
        and not x.kv
        and not x.children
        and (x.low is None or x.low.empty())
        and x.parent.children.get(x.key) is x
    ):
        del cast(dict[bytes, _Block], x.parent.children)[x.key]
        x = x.parent


def _forget_if_gone(worker_id: int, node: _Block) -> None:
    """A block the worker holds on no tier cannot be named: its states go on every tier."""
    low = node.low
    if worker_id in node.kv or (low is not None and low.holds(worker_id)):
        return
    node.drop_state(worker_id)
    if low is not None:
        low.states[HOST].discard(worker_id)
        low.states[DISK].discard(worker_id)


def _resolve_low(w: _Worker, h: int, node: _Block) -> None:
    """Lower-tier states announced under `h` before its block was known now count."""
    for medium in _LOWER:
        pending = w.low[medium].pending_states
        if pending and h in pending:
            pending.discard(h)
            node.lower().states[medium].add(w.id)


def check_media(media: Any) -> tuple[str, ...]:
    """The tiers a per-tier query asks for: a sequence of DEVICE, HOST, DISK names."""
    if isinstance(media, str) or not isinstance(media, (list, tuple)) or not media:
        raise ValueError(f"media must be a non-empty list of {', '.join(MEDIA)}; got {media!r}")
    for m in media:
        if m not in _RANK:
            raise ValueError(f"media must name tiers from {', '.join(MEDIA)}; got {m!r}")
    return tuple(media)


def _check_hybrid(hybrid: Any) -> None:
    if not isinstance(hybrid, bool):
        raise TypeError(f"hybrid must be a bool, got {hybrid!r}")


def check_worker_id(worker_id: Any) -> None:
    if isinstance(worker_id, bool) or not isinstance(worker_id, int) or worker_id < 0:
        raise ValueError(f"worker_id must be an int >= 0, got {worker_id!r}")
