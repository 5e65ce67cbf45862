"""Residency below the device tree: what the tree lets go of is demoted into lower tiers
(host L2, store L3), and a request's prefix is looked up down the tiers. The replay and the
engine use the same decisions; they differ in how they carry them out (the replay accounts
bytes and seconds, the engine moves bytes between its pools).

Keys: a content hash chain over units (like SGLang HiCache's page-hash chain): the unit of
KV whose prefix hashes to `h` is `("kv", h)`, group `g` of the state at the end of prefix
`h` is `("st", h, g)` (one group unless a state is kept per vLLM Mamba group). Equal
prefixes give equal keys, so the tiers are inclusive: an entry loaded back stays below
until its LRU drops it.

* `TierTracker` is a tree listener: each node's (start, end) prefix hashes; it copies a
  node's KV and state down, naming the device unit they sit in (a KV index, a state
  slot), when its write policy says (`tier_write`): when the tree lets go of them
  (`node_removed`, `state_removed`: write-back), or while they are cached, once the node
  has been hit often enough (`hit`: write-through, write-through-selective).
* `LowerTiers` holds the host and store LRUs (`tier_lru`): what the host drops goes to the
  store, what the store drops is gone. With a `sink` it reports every move as an action
  (`Demote`, `Drop`, `Fetch`: a prefetch from the store into the host), in the order the
  caller must carry them out, and an entry becomes visible in a tier (`where`) only when
  the caller reports its bytes written there (`written`): publish after write. Without a
  sink (the replay) a write is instant.
* `cheapest`: the per-hit choice to load or recompute by cost (the replay's and the
  engine's).
* `Residency` looks a key up: every depth a load could restore (`plan`), the check that a
  depth is usable (`usable`), and, for the chosen depth, where each piece comes from
  (`restore_plan`), and host locks on what a load reads (`pin`, `unpin`).
  `tier_restore.restore` carries a load out through a `CacheManager`.

Invariants (`Residency.check_invariants`): each tier's bytes never exceed its capacity and
equal its entries'; an entry not yet written is reserved in its tier's LRU (and not
visible); a restored state still in the tree sits at the depth and on the prefix hash it
was restored for.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from mambaradix.core.node import TreeNode
from mambaradix.lifecycle.tier_lru import LowerTier
from mambaradix.lifecycle.tier_write import SELECTIVE_HITS, WritePolicy, write_threshold
from mambaradix.names import Names

ROOT_HASH = 0


class Level(Names):
    """The lower tiers, by name."""

    HOST = "host"
    STORE = "store"


HOST, STORE = Level
Key = tuple[Hashable, ...]


def chain(start: int, units: Iterable[int]) -> int:
    """The prefix hash after `units`, from `start`."""
    h = start
    for u in units:
        h = hash((h, u))
    return h


def node_depth(node: TreeNode) -> int:
    """Units from the root to the end of `node`."""
    depth = 0
    while node.parent is not None:
        depth += len(node.key)
        node = node.parent
    return depth


# ----------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Demote:
    """Write `key`'s bytes into `tier`: from device unit `source` (a KV index, a state
    slot) or, when `source` is None, from its copy in the host (host -> store). Visible
    there once the caller calls `LowerTiers.written(key, tier)`."""

    key: Key
    tier: str
    nbytes: int
    source: int | None


@dataclass(frozen=True)
class Drop:
    """`key` left `tier`: its bytes there may be reused."""

    key: Key
    tier: str


@dataclass(frozen=True)
class Fetch:
    """Read `key`'s bytes from the store into the host ahead of a load (a prefetch);
    visible in the host once the caller calls `LowerTiers.written(key, HOST)`, pinned
    there until `LowerTiers.fetched`."""

    key: Key
    tier: str
    nbytes: int


Action = Demote | Drop | Fetch
Sink = Callable[[Action], None]


@dataclass
class TierStats:
    loads: dict[str, int] = field(default_factory=lambda: {HOST: 0, STORE: 0})
    loaded_bytes: dict[str, int] = field(default_factory=lambda: {HOST: 0, STORE: 0})
    recomputed: int = 0  # hits below the rule chose to recompute
    failed: int = 0  # restores with no device memory for them
    demoted_bytes: dict[str, int] = field(default_factory=lambda: {HOST: 0, STORE: 0})
    dropped_bytes: int = 0  # fell out of the last tier
    unbacked_bytes: int = 0  # left the device with no copy below (write-through policies)


class LowerTiers:
    """The host and store LRUs, demotion between them, and the actions it takes."""

    def __init__(self, host: LowerTier, store: LowerTier, sink: Sink | None = None) -> None:
        self.host, self.store = host, store
        self.stats = TierStats()
        self.sink = sink
        self.unwritten: set[tuple[str, Key]] = set()  # (tier, key) reserved, not yet written
        self.lost: set[tuple[str, Key]] = set()  # forgotten while a read ahead pinned them

    def where(self, key: Key) -> str | None:
        """The highest tier holding `key`'s written bytes, or None."""
        pending = self.unwritten
        if key in self.host and not (pending and (HOST, key) in pending):
            return HOST
        if key in self.store and not (pending and (STORE, key) in pending):
            return STORE
        return None

    def demote(self, key: Key, nbytes: int, source: int | None = None) -> None:
        """`key` (in device unit `source`) leaves the device: into the host, what the host
        drops into the store (a key larger than the host goes straight there)."""
        if key in self.host:
            self.host.touch(key)
            return
        self.stats.demoted_bytes[HOST] += nbytes
        for old, size in self.host.put(key, nbytes):
            if old == key:  # larger than the host: from the device to the store
                self._to_store(key, size, source)
                continue
            assert isinstance(old, tuple)
            self._to_store(old, size, None)  # copied from the host before the host drops it
            self._drop(old, HOST)
        if key in self.host:
            self._write(key, HOST, nbytes, source)

    def release(self, key: Key, nbytes: int) -> None:
        """The device let go of `key` under a write-through policy: its copy below, if
        any, becomes the most recent there; with none its bytes are gone (counted)."""
        if key in self.host:
            self.host.touch(key)
        elif key in self.store:
            self.store.touch(key)
        else:
            self.stats.unbacked_bytes += nbytes

    def _to_store(self, key: Key, nbytes: int, source: int | None) -> None:
        if key in self.store:
            self.store.touch(key)
            return
        self.stats.demoted_bytes[STORE] += nbytes
        for old, size in self.store.put(key, nbytes):
            self.stats.dropped_bytes += size
            if old != key:
                assert isinstance(old, tuple)
                self._drop(old, STORE)
        if key in self.store:
            self._write(key, STORE, nbytes, source)

    def _write(self, key: Key, tier: str, nbytes: int, source: int | None) -> None:
        if self.sink is not None:
            self.unwritten.add((tier, key))
            self.sink(Demote(key, tier, nbytes, source))

    def _drop(self, key: Key, tier: str) -> None:
        if self.sink is not None:
            self.unwritten.discard((tier, key))
            self.sink(Drop(key, tier))

    def fetch(self, key: Key, nbytes: int) -> bool:
        """Reserve a host entry for `key`, which the store holds, to be read up there (a
        `Fetch`; the host drops what it must for it, as a demotion does); the host entry
        and the store's are pinned until `fetched` (the store keeps the object the read
        reads). False (nothing done) when the host has it or no room for it."""
        if self.sink is None or key in self.host or self.where(key) != STORE:
            return False
        self.store.pin(key)
        for old, size in self.host.put(key, nbytes):
            if old == key:  # every entry pinned: no room
                self.store.unpin(key)
                return False
            assert isinstance(old, tuple)
            self._to_store(old, size, None)
            self._drop(old, HOST)
        self.host.pin(key)
        self.unwritten.add((HOST, key))
        self.sink(Fetch(key, HOST, nbytes))
        return True

    def fetched(self, key: Key, ok: bool) -> None:
        """The `Fetch` of `key` finished: visible in the host, or (`ok` False: the store
        missed) gone from there."""
        self.host.unpin(key)
        self.store.unpin(key)
        if (STORE, key) in self.lost:
            self.lost.discard((STORE, key))
            self.forget(key, STORE)
        if ok:
            self.written(key, HOST)
        else:
            self.forget(key, HOST)

    def adopt(self, key: Key, nbytes: int) -> list[Key]:
        """`key`'s bytes are in the store already (found there at start: a store outlives
        its process): listed, written, as its most recent entry. Returns the entries that
        no longer fit (the caller deletes them), with no action."""
        return [old for old, _ in self.store.put(key, nbytes)]  # type: ignore[misc]

    def written(self, key: Key, tier: str) -> None:
        """The caller wrote `key`'s bytes into `tier`: from now on `where` finds them (a
        no-op when the tier dropped the entry since: actions are reported before they are
        carried out, so a write may finish after its entry's `Drop` was reported)."""
        self.unwritten.discard((tier, key))

    def forget(self, key: Key, tier: str) -> None:
        """The caller could not write `key` into `tier`, or found its bytes there lost
        (a store that refused or lost them): the entry goes, with no action. One a read
        ahead still pins (`fetch`) is hidden now (unwritten) and goes at its `fetched`."""
        lru = self.host if tier == HOST else self.store
        if lru.pinned(key):
            self.unwritten.add((tier, key))
            self.lost.add((tier, key))
            return
        lru.remove(key)
        self.unwritten.discard((tier, key))

    def touch(self, key: Key) -> None:
        tier = self.host if key in self.host else self.store
        tier.touch(key)

    def check(self) -> None:
        self.host.check()
        self.store.check()
        for tier, key in self.unwritten:
            if key not in (self.host if tier == HOST else self.store):
                raise AssertionError(f"{key!r} is being written to the {tier} but not reserved")
        for tier, key in self.lost:  # forgotten under a read ahead: hidden, still pinned
            lru = self.host if tier == HOST else self.store
            if (tier, key) not in self.unwritten or not lru.pinned(key):
                raise AssertionError(f"{key!r}, lost in the {tier}, is visible or unpinned")


# ----------------------------------------------------------------------- tracker


class TierTracker:
    """A tree listener: each node's prefix hashes; copies units down as its write policy
    says (`lifecycle.tier_write`): what the tree lets go of (write-back), or what it caches
    once a node has been hit `hits` times (write-through: once, on the insert that adds it).
    `prompt_only`: copy only states at positions some prompt reached (`note_prompt`;
    vLLM offloads no decode-phase state, vllm #56972). `state_groups`: entries per state."""

    def __init__(
        self,
        tiers: LowerTiers,
        kv_unit_bytes: int,
        state_bytes: int,
        state_groups: int = 1,
        prompt_only: bool = False,
        write: WritePolicy = WritePolicy.WRITE_BACK,
        hits: int = SELECTIVE_HITS,
    ) -> None:
        self.tiers, self.state_groups, self.prompt_only = tiers, state_groups, prompt_only
        self.kv_unit_bytes = kv_unit_bytes
        self.group_bytes = -(-state_bytes // state_groups)
        self.write, self.threshold = write, write_threshold(write, hits)
        self.spans: dict[TreeNode, tuple[int, int]] = {}  # node -> (start hash, end hash)
        self.slots: dict[TreeNode, int] = {}  # node -> its state's slot (gone at a tombstone)
        self.prompt_ends: set[int] = set()  # prefix hashes some prompt reached
        self.prompt_states: set[TreeNode] = set()  # states added at a prompt position
        self.restored: dict[TreeNode, tuple[int, int]] = {}  # node -> (depth, hash) loaded
        self.hits: dict[TreeNode, int] = {}  # write-through: a node's hits so far
        self.backed: set[TreeNode] = set()  # write-through: nodes copied down (states too)

    def state_keys(self, end: int) -> list[Key]:
        return [("st", end, g) for g in range(self.state_groups)]

    # TreeListener
    def node_added(self, node: TreeNode) -> None:
        parent = node.parent
        start = self.spans[parent][1] if parent in self.spans else ROOT_HASH
        self.spans[node] = (start, chain(start, node.key))
        if self.threshold is not None:
            self.hits[node] = 1  # the insert that adds a node is its first hit (SGLang's)
            self._write_through(node)

    def node_split(self, upper: TreeNode, lower: TreeNode) -> None:
        start, end = self.spans[lower]
        mid = chain(start, upper.key)
        self.spans[upper] = (start, mid)
        self.spans[lower] = (mid, end)
        if lower in self.hits:  # the upper part keeps the node's count and copies
            self.hits[upper] = self.hits[lower]
        if lower in self.backed:
            self.backed.add(upper)

    def node_removed(self, node: TreeNode) -> None:
        start, _ = self.spans.pop(node)
        self.prompt_states.discard(node)
        self.restored.pop(node, None)
        self.hits.pop(node, None)
        self.backed.discard(node)
        h, nbytes, tiers = start, self.kv_unit_bytes, self.tiers
        for u, index in zip(node.key, node.value, strict=True):
            h = hash((h, u))
            if self.threshold is None:
                tiers.demote(("kv", h), nbytes, index)
            else:  # copied down already, if ever: the device copy just goes
                tiers.release(("kv", h), nbytes)

    def state_added(self, node: TreeNode) -> None:
        if node.state is not None:
            self.slots[node] = node.state
        if self.spans[node][1] in self.prompt_ends:
            self.prompt_states.add(node)
        if node in self.backed:
            self._state_down(node)

    def state_removed(self, node: TreeNode) -> None:
        slot = self.slots.pop(node, None)
        at_prompt = node in self.prompt_states
        self.prompt_states.discard(node)
        self.restored.pop(node, None)
        keys = self.state_keys(self.spans[node][1])
        if self.threshold is not None:
            for key in keys:
                self.tiers.release(key, self.group_bytes)
            return
        if self.prompt_only and not at_prompt:
            return  # vLLM offloads no decode-phase state (vllm #56972)
        for key in keys:
            self.tiers.demote(key, self.group_bytes, slot)

    def tree_reset(self) -> None:
        self.spans.clear()
        self.slots.clear()
        self.prompt_states.clear()
        self.restored.clear()
        self.hits.clear()
        self.backed.clear()

    # write-through
    def hit(self, node: TreeNode | None) -> None:
        """A request was admitted on the prefix ending at `node`: each node on its path
        counts a hit; those reaching the policy's threshold are copied down."""
        if self.threshold is None:
            return
        while node is not None and node in self.spans:
            self.hits[node] += 1
            self._write_through(node)
            node = node.parent

    def _write_through(self, node: TreeNode) -> None:
        """Copy `node`'s KV and state down once its hits reach the threshold."""
        assert self.threshold is not None
        if node in self.backed or self.hits[node] < self.threshold:
            return
        self.backed.add(node)
        h, demote, nbytes = self.spans[node][0], self.tiers.demote, self.kv_unit_bytes
        for u, index in zip(node.key, node.value, strict=True):
            h = hash((h, u))
            demote(("kv", h), nbytes, index)
        if node in self.slots:
            self._state_down(node)

    def _state_down(self, node: TreeNode) -> None:
        """Copy `node`'s state down from its slot (the KV it depends on went first)."""
        if self.prompt_only and node not in self.prompt_states:
            return
        for key in self.state_keys(self.spans[node][1]):
            self.tiers.demote(key, self.group_bytes, self.slots[node])


# ----------------------------------------------------------------------- lookup


@dataclass
class Candidate:
    depth: int  # units
    host_bytes: int  # bytes the load takes from the host
    store_bytes: int  # bytes it takes from the store (they cross the host link too)
    saved_s: float = 0.0  # recompute seconds - load seconds (the replay's rule)
    load_s: float = 0.0


def cheapest(
    cands: list[Candidate],
    start: int,
    load_s: Callable[[Candidate], float],
    recompute_s: Callable[[int, int], float],
) -> Candidate | None:
    """The per-hit choice to load or recompute (the replay's and the engine's): each
    candidate's load seconds and the seconds it saves (recomputing its units past the
    device's `start`, `recompute_s(start, units)`, minus loading them); the candidate that
    saves the most, or None when recomputing is cheaper for every one."""
    for c in cands:
        c.load_s = load_s(c)
        c.saved_s = recompute_s(start, c.depth - start) - c.load_s
    best = max(cands, key=lambda c: c.saved_s, default=None)
    return best if best is not None and best.saved_s > 0 else None


@dataclass(frozen=True)
class RestorePlan:
    """Where each piece of a load to `depth` (prefix hash `end`) comes from: the KV units
    past the device's (index along the key, content key, tier), then the state's groups."""

    depth: int
    end: int
    kv: list[tuple[int, Key, str]]
    state: list[tuple[Key, str]]


class Residency:
    """The tiers and their tracker, and the lookups of a key down the tiers (module
    docstring). `page`: the tree's page; a restored depth is on its grid."""

    def __init__(self, tiers: LowerTiers, tracker: TierTracker, page: int) -> None:
        self.tiers, self.tracker, self.page = tiers, tracker, page

    def plan(self, key: Sequence[int], start: int, kv_on_device: int) -> list[Candidate]:
        """Every depth past `start`, on the page grid, whose state (every group of it) is
        below and whose every unit of KV is on the device (the first `kv_on_device`) or
        below; by depth."""
        tiers, page, kv_bytes = self.tiers, self.page, self.tracker.kv_unit_bytes
        group_bytes, state_keys = self.tracker.group_bytes, self.tracker.state_keys
        out: list[Candidate] = []
        h, kv_host, kv_store = ROOT_HASH, 0, 0
        for i, u in enumerate(key, 1):
            h = hash((h, u))
            if i > kv_on_device:
                where = tiers.where(("kv", h))
                if where is None:
                    break
                if where == HOST:
                    kv_host += kv_bytes
                else:
                    kv_store += kv_bytes
            if i <= start or i % page:
                continue
            places = [tiers.where(k) for k in state_keys(h)]
            if None in places:
                continue
            st_store = places.count(STORE) * group_bytes
            st_host = places.count(HOST) * group_bytes
            out.append(Candidate(i, kv_host + st_host, kv_store + st_store))
        return out

    def usable(self, key: Sequence[int], depth: int, kv_on_device: int) -> bool:
        """Every group of the state at `depth` below, and the KV of every unit to it on
        the device or below: the only hit a load may give."""
        h = ROOT_HASH
        for i in range(depth):
            h = hash((h, key[i]))
            if i + 1 > kv_on_device and self.tiers.where(("kv", h)) is None:
                return False
        return all(self.tiers.where(k) is not None for k in self.tracker.state_keys(h))

    def restore_plan(self, key: Sequence[int], depth: int, kv_on_device: int) -> RestorePlan:
        """Where each piece of a load to `depth` comes from (ValueError if it is not
        `usable`)."""
        where = self.tiers.where
        kv: list[tuple[int, Key, str]] = []
        h = ROOT_HASH
        for i in range(depth):
            h = hash((h, key[i]))
            if i + 1 > kv_on_device:
                tier = where(("kv", h))
                if tier is None:
                    raise ValueError(f"unit {i} of a load to depth {depth} is in no tier")
                kv.append((i, ("kv", h), tier))
        state = []
        for k in self.tracker.state_keys(h):
            tier = where(k)
            if tier is None:
                raise ValueError(f"the state at depth {depth} is in no tier")
            state.append((k, tier))
        return RestorePlan(depth, h, kv, state)

    def pin(self, plan: RestorePlan) -> list[tuple[LowerTier, Key]]:
        """Pin every entry `plan` reads where it is (a host lock: the demotions that the
        load's own allocation causes pass over them); hand the result to `unpin`."""
        pins = []
        for key, tier in [(k, t) for _, k, t in plan.kv] + plan.state:
            lru = self.tiers.host if tier == HOST else self.tiers.store
            lru.pin(key)
            pins.append((lru, key))
        return pins

    def unpin(self, pins: list[tuple[LowerTier, Key]]) -> None:
        for lru, key in pins:
            lru.unpin(key)

    def touch(self, key: Sequence[int], depth: int) -> None:
        """A load used the path to `depth`: its entries become the most recent."""
        h = ROOT_HASH
        for i in range(depth):
            h = hash((h, key[i]))
            if self.tiers.where(("kv", h)) is not None:
                self.tiers.touch(("kv", h))
        for k in self.tracker.state_keys(h):
            self.tiers.touch(k)

    def hit(self, node: TreeNode | None) -> None:
        """A request was admitted on the prefix ending at `node` (`TierTracker.hit`)."""
        self.tracker.hit(node)

    def note_prompt(self, key: Sequence[int]) -> None:
        """With `prompt_only`: the prefix hashes a prompt reaches."""
        if self.tracker.prompt_only:
            h = ROOT_HASH
            for u in key:
                h = hash((h, u))
                self.tracker.prompt_ends.add(h)

    def restored(self, node: TreeNode, depth: int, key: Sequence[int]) -> None:
        """A load put a state at `node` for `key[:depth]` (AssertionError unless the node
        ends there)."""
        end = chain(ROOT_HASH, key[:depth])
        self.tracker.restored[node] = (depth, end)
        self._check_restored(node, depth, end)

    def _check_restored(self, node: TreeNode, depth: int, end: int) -> None:
        if node_depth(node) != depth or self.tracker.spans[node][1] != end:
            raise AssertionError(f"a state restored for depth {depth} sits at {node!r}")

    def check_invariants(self) -> None:
        """The tiers' bytes and reservations; every restored state still in the tree at its
        depth and prefix hash (AssertionError)."""
        self.tiers.check()
        for node, (depth, end) in self.tracker.restored.items():
            self._check_restored(node, depth, end)
