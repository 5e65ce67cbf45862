"""An event emitter on a `MambaRadixCache`: what a router needs to know, as block events.

Listens to the tree (`add_listener`) and keeps, per node, the chained hashes of the
blocks of `block_size` tokens that end inside its edge. Only full blocks are announced.

* KV (group 0): a new node announces the blocks that end inside it; a removed node
  retracts them (a block is gone as soon as any of its tokens is: the node holding its
  last token is the deepest, so it leaves first).
* States (group 1, kind "mamba"): a state exactly at a block end is announced under
  that block's hash; tombstoning or evicting it retracts it. A state off the block grid
  is never announced (a router floors to the deepest announced state, never rounds up).
* `AllBlocksCleared` on `reset()`; `dump()` describes the current contents.

Lower tiers (`stored_on` / `removed_from`, called by whoever moves bytes): a node's KV
blocks or its state copied to HOST or DISK, or dropped there, announced with that
`medium` under the same hashes. The tree's own events stay about the device: a node the
tree evicts from the device keeps what was announced on the lower tiers until
`removed_from` (call it while the node is still in the tree) or a reset.

A split moves block ownership between two nodes and announces nothing. Nodes under an
`extra_key` namespace, and tokens outside uint32 (the hash input), are not announced:
`skipped_blocks` counts them; a router then under-credits, never over-credits.
"""

from __future__ import annotations

from array import array
from dataclasses import replace
from typing import Any

from mambaradix.core.node import TreeNode
from mambaradix.core.tree import MambaRadixCache
from mambaradix.events.hashing import block_digest, digest_to_int64
from mambaradix.events.model import (
    DISK,
    HOST,
    KV_GROUP,
    STATE_GROUP,
    STATE_KIND,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
)


class _Blocks:
    """What the emitter knows about one node."""

    __slots__ = ("end", "digests", "prev", "carry", "tail", "state_hash", "live")

    def __init__(
        self, end: int, digests: list[bytes], prev: bytes | None, tail: array[int], live: bool
    ) -> None:
        self.end = end  # tokens from the root to the end of the node's edge
        self.digests = digests  # blocks ending inside the edge, in order
        self.prev = prev  # digest of the block before the first of them (None: no block)
        self.carry = digests[-1] if digests else prev  # last block ending at or before `end`
        self.tail = tail  # tokens after that block, up to `end` (fewer than block_size)
        self.state_hash: int | None = None  # the state announced in the state group
        self.live = live  # False: nothing below here is announced


class EventEmitter:
    """Block events for `tree` at `block_size` tokens per block (a multiple of its page size).

    Events queue up until `take()`; the existing contents are queued at construction."""

    def __init__(self, tree: MambaRadixCache, block_size: int) -> None:
        if not isinstance(tree, MambaRadixCache):
            raise TypeError(f"tree must be a MambaRadixCache, got {type(tree).__name__}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if block_size % tree.page_size:
            raise ValueError(
                f"block_size ({block_size}) must be a multiple of the tree's page_size "
                f"({tree.page_size})"
            )
        self.tree = tree
        self.block_size = block_size
        self.skipped_blocks = 0
        self._root = _Blocks(0, [], None, array("q"), True)
        self._nodes: dict[TreeNode, _Blocks] = {}
        self._pending: list[Event] = []
        # what is announced on the lower tiers: (medium, group, hash) -> its store, for dump
        self._lower: dict[tuple[str, int, int], BlockStored] = {}
        for node in _parents_first(tree.root):
            self.node_added(node)
            if node.state is not None:
                self.state_added(node)
        tree.add_listener(self)

    def take(self) -> list[Event]:
        """The events since the last call, oldest first."""
        out, self._pending = self._pending, []
        return out

    def close(self) -> None:
        """Stop listening to the tree."""
        self.tree.remove_listener(self)

    def dump(self) -> list[Event]:
        """Events that rebuild the current contents from nothing: `AllBlocksCleared`, then
        every stored block (parents first) and every announced state, then what is
        announced on the lower tiers, in the order it was."""
        out: list[Event] = [AllBlocksCleared()]
        for node in _parents_first(self.tree.root):
            info = self._nodes[node]
            if info.digests:
                out.append(self._kv_stored(self._info_of(node.parent), node, info))
            if info.state_hash is not None:
                out.append(self._state_stored(node, info))
        out.extend(self._lower.values())
        return out

    # ---------------------------------------------------------- lower tiers

    def stored_on(self, medium: str, node: TreeNode, kv: bool = True, state: bool = False) -> None:
        """`node`'s KV blocks (those ending inside its edge; `kv`) and/or its state (if it
        sits on a block end; `state`) are now also on `medium` (HOST or DISK). Report a
        node once its ancestors' tokens are there too (HiCache backs up parents first):
        a router places a block under its parent."""
        info = self._check_lower(medium, node, kv, state)
        if kv and info.digests:
            event = replace(self._kv_stored(self._info_of(node.parent), node, info), medium=medium)
            self._pending.append(event)
            for one in _one_per_block(event):
                self._lower[(medium, KV_GROUP, one.block_hashes[0])] = one
        if state and info.digests and info.end % self.block_size == 0:
            event = replace(self._state_stored(node, info), medium=medium)
            self._pending.append(event)
            self._lower[(medium, STATE_GROUP, event.block_hashes[0])] = event

    def removed_from(
        self, medium: str, node: TreeNode, kv: bool = True, state: bool = False
    ) -> None:
        """`node`'s KV blocks and/or its state left `medium` (HOST or DISK). Removing the
        KV removes the state there too, for a router (as on the device)."""
        info = self._check_lower(medium, node, kv, state)
        if not info.digests:
            return
        last = digest_to_int64(info.digests[-1])
        if state and info.end % self.block_size == 0:
            self._pending.append(BlockRemoved((last,), STATE_GROUP, medium))
            self._lower.pop((medium, STATE_GROUP, last), None)
        if kv:
            hashes = tuple(digest_to_int64(d) for d in info.digests)
            self._pending.append(BlockRemoved(hashes, KV_GROUP, medium))
            for h in hashes:
                self._lower.pop((medium, KV_GROUP, h), None)
            if info.end % self.block_size == 0:
                self._lower.pop((medium, STATE_GROUP, last), None)

    def _check_lower(self, medium: Any, node: Any, kv: Any, state: Any) -> _Blocks:
        if medium not in (HOST, DISK):
            raise ValueError(
                f"medium must be {HOST!r} or {DISK!r} (the tree reports the device itself), "
                f"got {medium!r}"
            )
        if not isinstance(kv, bool) or not isinstance(state, bool) or not (kv or state):
            raise ValueError(f"kv and state must be bools, one of them True; got {kv!r}, {state!r}")
        info = self._nodes.get(node) if isinstance(node, TreeNode) else None
        if info is None:
            raise ValueError(f"node must be a node of the tree (not its root), got {node!r}")
        return info

    # ------------------------------------------------------------- listener

    def node_added(self, node: TreeNode) -> None:
        parent = self._info_of(node.parent)
        info = self._hash_blocks(parent, node)
        self._nodes[node] = info
        if info.digests:
            self._pending.append(self._kv_stored(parent, node, info))

    def node_split(self, upper: TreeNode, lower: TreeNode) -> None:
        info = self._nodes[lower]
        start = info.end - len(upper.key) - len(lower.key)
        mid = start + len(upper.key)
        moved = mid // self.block_size - start // self.block_size
        up_digests, info.digests = info.digests[:moved], info.digests[moved:]
        if up_digests:
            boundary = mid - mid % self.block_size
            tail = upper.key[boundary - start :]
        else:
            tail = self._info_of(upper.parent).tail + upper.key
        up = _Blocks(mid, up_digests, info.prev, tail, info.live)
        self._nodes[upper] = up
        info.prev = up.carry

    def node_removed(self, node: TreeNode) -> None:
        info = self._nodes.pop(node, None)
        if info is None:
            return
        self._retract_state(info)
        if info.digests:
            hashes = tuple(digest_to_int64(d) for d in info.digests)
            self._pending.append(BlockRemoved(hashes))

    def state_added(self, node: TreeNode) -> None:
        info = self._nodes[node]
        if info.digests and info.end % self.block_size == 0:
            self._pending.append(self._state_stored(node, info))
            info.state_hash = digest_to_int64(info.digests[-1])

    def state_removed(self, node: TreeNode) -> None:
        self._retract_state(self._nodes[node])

    def tree_reset(self) -> None:
        self._nodes.clear()
        self._lower.clear()  # AllBlocksCleared clears every medium
        self._pending.append(AllBlocksCleared())

    # -------------------------------------------------------------- helpers

    def _retract_state(self, info: _Blocks) -> None:
        if info.state_hash is not None:
            self._pending.append(BlockRemoved((info.state_hash,), STATE_GROUP))
            info.state_hash = None

    def _info_of(self, node: TreeNode | None) -> _Blocks:
        if node is None or node.parent is None:
            return self._root
        return self._nodes[node]

    def _hash_blocks(self, parent: _Blocks, node: TreeNode) -> _Blocks:
        size = self.block_size
        tokens = parent.tail + node.key
        n = len(tokens) // size
        live = parent.live and node.namespace is None
        digests: list[bytes] = []
        prev = parent.carry
        if live:
            try:
                for i in range(n):
                    prev = block_digest(prev, tokens[i * size : (i + 1) * size])
                    digests.append(prev)
            except OverflowError:
                live, digests = False, []
        if not live:
            self.skipped_blocks += n
        return _Blocks(parent.end + len(node.key), digests, parent.carry, tokens[n * size :], live)

    def _kv_stored(self, parent: _Blocks, node: TreeNode, info: _Blocks) -> BlockStored:
        tokens = (parent.tail + node.key)[: len(info.digests) * self.block_size]
        prev = None if info.prev is None else digest_to_int64(info.prev)
        hashes = tuple(digest_to_int64(d) for d in info.digests)
        return BlockStored(hashes, prev, tuple(tokens), self.block_size)

    def _state_stored(self, node: TreeNode, info: _Blocks) -> BlockStored:
        before = info.digests[-2] if len(info.digests) > 1 else info.prev
        tokens = _last_tokens(node, self.block_size)
        prev = None if before is None else digest_to_int64(before)
        last = digest_to_int64(info.digests[-1])
        return BlockStored((last,), prev, tokens, self.block_size, STATE_GROUP, STATE_KIND)


def _one_per_block(e: BlockStored) -> list[BlockStored]:
    """A KV store split into one store per block, each under the block before it."""
    out, parent, size = [], e.parent_block_hash, e.block_size
    for i, h in enumerate(e.block_hashes):
        tokens = tuple(e.token_ids[i * size : (i + 1) * size])
        out.append(replace(e, block_hashes=(h,), parent_block_hash=parent, token_ids=tokens))
        parent = h
    return out


def _parents_first(root: TreeNode) -> list[TreeNode]:
    """Depth first, each node before its children, children in the tree's order."""
    out, stack = [], list(reversed(root.children.values()))
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(node.children.values()))
    return out


def _last_tokens(node: TreeNode, n: int) -> tuple[int, ...]:
    """The last `n` tokens of the root-to-node path."""
    parts: list[Any] = []
    got, x = 0, node
    while got < n and x.parent is not None:
        parts.append(x.key)
        got += len(x.key)
        x = x.parent
    path = array("q")
    for part in reversed(parts):
        path += part
    return tuple(path[-n:])
