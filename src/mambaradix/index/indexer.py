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
KV blocks, so only those states are credited. A block whose parent the worker never
stored is not placed (and not credited). A block whose hashes depend on more than its
tokens (a LoRA adapter, a cache salt: `namespace`) is not placed: a query by token ids
cannot name it. Only device blocks are placed (`medium` DEVICE or unset); blocks on a
lower tier (HOST, DISK) are kept per medium by hash only, for the per-tier answer that
the tiers will add (`worker_info`'s "media"). A removal names a group; its kind is
the one that group's stores carried, and a removal of an unknown group drops both the
KV and the state. Removing a block's KV also drops the worker's state there. One
block (parent and tokens) stored under several hashes (vLLM adds extra keys, an image's
hash, to a block's) is held until every one of them is removed.
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
    STATE_KINDS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
)

log = logging.getLogger("mambaradix.index")
_KV, _STATE, _OTHER, _UNKNOWN = "kv", "state", "other", "unknown"
_MAX_PENDING_STATES = 1 << 16


_NO_CHILDREN: Mapping[bytes, _Block] = MappingProxyType({})  # shared and read-only
_NO_STATES: frozenset[int] = frozenset()


class _Block:
    __slots__ = ("parent", "key", "children", "kv", "states")

    def __init__(self, parent: _Block | None, key: bytes) -> None:
        self.parent = parent
        self.key = key  # the block's tokens, int64 native bytes
        # Most blocks are leaves without states: they share empty read-only containers
        # until they need their own (a new node then costs one set, not three containers).
        self.children: Mapping[bytes, _Block] = _NO_CHILDREN
        self.kv: set[int] = set()  # workers holding this block's KV (with all before it)
        self.states: AbstractSet[int] = _NO_STATES  # workers with a state at its end

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
        # Blocks on a lower tier: (medium, "kv" or "state") -> the hashes held there.
        # Only counted for now; the per-tier answer will place them in the trie.
        self.media: dict[tuple[str, str], set[int]] = {}
        self.ahead = _Ahead()


@dataclass(frozen=True, slots=True)
class Overlap:
    longest_matched: int
    usable: int
    tail_recompute: int


class Indexer:
    """Feed events per worker with `apply` (in order); ask with `query`."""

    def __init__(self, block_size: int, hybrid: bool = True) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
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
        for node in w.blocks.values():
            self._drop(w.id, node)
        w.blocks.clear()
        w.aliases.clear()
        w.pending_states.clear()
        w.media.clear()
        w.ahead.clear()

    def worker_ids(self) -> list[int]:
        return sorted(self._workers)

    def worker_info(self, worker_id: int) -> dict[str, Any]:
        w = self._worker(worker_id)
        states = sum(1 for node in w.blocks.values() if w.id in node.states)
        media: dict[str, dict[str, int]] = {}
        for (medium, role), hashes in w.media.items():
            if hashes:
                media.setdefault(medium, {})[role] = len(hashes)
        return {
            "instance_id": w.id,
            "hybrid": w.hybrid,
            "blocks": len(w.blocks),
            "states": states,
            "skipped": dict(w.skipped),
            "media": media,
        }

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
            return self._lower(w, e.medium, role, e.block_hashes, True)
        if e.block_size != self.block_size:
            return _skip(w, f"block_size {e.block_size}")
        if role == _KV:
            self._place(w, e)
        elif role == _STATE:
            for h in e.block_hashes:
                node = w.blocks.get(h)
                if node is not None:
                    node.add_state(w.id)
                elif len(w.pending_states) < _MAX_PENDING_STATES:
                    w.pending_states.add(h)
        else:
            _skip(w, f"group {e.group} kind {e.kind}")

    def _place(self, w: _Worker, e: BlockStored) -> None:
        if e.parent_block_hash is None:
            parent = self._root
        else:
            found = w.blocks.get(e.parent_block_hash)
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
            parent = node
        if ahead is not None or w.ahead.of:  # lookaheads to note, or to forget
            for i, h in enumerate(e.block_hashes):
                if ahead is not None:
                    w.ahead.add(h, blocks[h], ahead[i])
                else:
                    w.ahead.discard(h)
        return None

    def _lower(
        self, w: _Worker, medium: str, role: str, hashes: Iterable[int], stored: bool
    ) -> None:
        """Blocks stored on (or removed from) a lower tier: kept by hash, per medium. A
        removal of an unknown group drops both roles, as on the device."""
        roles = (_KV, _STATE) if role == _UNKNOWN and not stored else (role,)
        if medium not in (HOST, DISK):
            return _skip(w, f"medium {medium}")
        if roles[0] not in (_KV, _STATE):
            return _skip(w, f"medium {medium} role {role}")
        for r in roles:
            held = w.media.setdefault((medium, r), set())
            if stored:
                held.update(hashes)
            else:
                held.difference_update(hashes)
        return None

    def _removed(self, w: _Worker, e: BlockRemoved) -> None:
        role = self._role(w, e.group, None)
        if e.medium not in (None, DEVICE):
            return self._lower(w, e.medium, role, e.block_hashes, False)
        for h in e.block_hashes:
            if role == _STATE:
                w.pending_states.discard(h)
                node = w.blocks.get(h)
                if node is not None:
                    node.drop_state(w.id)
            elif role in (_KV, _UNKNOWN):
                w.pending_states.discard(h)
                w.ahead.discard(h)
                gone = w.blocks.pop(h, None)
                if gone is not None:
                    self._release(w, gone)

    def _role(self, w: _Worker, group: int | None, kind: str | None) -> str:
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
        x: _Block | None = node
        while (
            x is not None
            and x.parent is not None
            and not x.kv
            and not x.children
            and x.parent.children.get(x.key) is x
        ):
            del cast(dict[bytes, _Block], x.parent.children)[x.key]
            x = x.parent

    # -------------------------------------------------------------------- query

    def query(self, token_ids: Any) -> dict[int, Overlap]:
        """Per registered worker, what it holds of the prompt `token_ids`."""
        if isinstance(token_ids, (Mapping, AbstractSet)):  # no order: not a prompt
            raise TypeError(f"token_ids must be a sequence, got {type(token_ids).__name__}")
        if isinstance(token_ids, (bytes, bytearray)):  # array() would read raw memory
            token_ids = list(token_ids)
        try:
            tokens = array("q", token_ids)
        except (TypeError, OverflowError):
            raise TypeError("token_ids must be a sequence of 64-bit ints") from None
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
        while matched and not w.ahead.allows(path[matched // size - 1], data, 8 * matched):
            matched -= size
        state = min(matched, cap) // size * size
        while state and w.id not in path[state // size - 1].states:
            state -= size
        return matched, state

    def _overlap(self, worker_id: int, matched: int, state_end: int, cap: int) -> Overlap:
        usable = state_end if self._workers[worker_id].hybrid else min(matched, cap)
        return Overlap(matched, usable, matched - usable)

    # --------------------------------------------------------------------- dump

    def dump(self, worker_id: int) -> list[Event]:
        """Events that rebuild what the worker holds: `AllBlocksCleared`, then its blocks
        parents first, each with the state it holds at its end."""
        w = self._worker(worker_id)
        name = {id(node): h for h, node in w.blocks.items()}
        out: list[Event] = [AllBlocksCleared()]
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if w.id not in node.kv:
                continue
            h = name[id(node)]
            parent = None if node.parent is self._root else name[id(node.parent)]
            tokens = array("q")
            tokens.frombytes(node.key)
            out.append(BlockStored((h,), parent, tuple(tokens), self.block_size))
            if w.id in node.states:
                out.append(BlockStored((h,), parent, tuple(tokens), self.block_size, 1, "mamba"))
            stack.extend(node.children.values())
        return out


def _skip(w: _Worker, why: str) -> None:
    w.skipped[why] = w.skipped.get(why, 0) + 1


def _check_hybrid(hybrid: Any) -> None:
    if not isinstance(hybrid, bool):
        raise TypeError(f"hybrid must be a bool, got {hybrid!r}")


def check_worker_id(worker_id: Any) -> None:
    if isinstance(worker_id, bool) or not isinstance(worker_id, int) or worker_id < 0:
        raise ValueError(f"worker_id must be an int >= 0, got {worker_id!r}")
