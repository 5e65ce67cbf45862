"""One intrusive doubly linked LRU list, used for both resources.

The head sentinel is the most-recently-used end, the tail sentinel the least.
Moving a link costs a handful of attribute writes and never allocates. Every
move to the MRU end stamps the link with a logical clock, so `check()` can
verify that the list order is the order of last use.

The default mode's KV list also *parks* links (`lru_leaf_parking`, `take_place`):
see "Depth-independent refresh" in `mambaradix.core.tree`.
"""

from __future__ import annotations

from collections.abc import Iterator

from mambaradix.core.node import Link


class LRUList:
    __slots__ = ("head", "tail", "size", "clock")

    def __init__(self) -> None:
        self.head = Link(None)
        self.tail = Link(None)
        self.head.next = self.tail
        self.tail.prev = self.head
        self.size = 0
        self.clock = 0

    def push_mru(self, link: Link) -> None:
        """Insert a link that is not in the list at the MRU end."""
        first = self.head.next
        assert first is not None
        link.prev, link.next = self.head, first
        first.prev = link
        self.head.next = link
        self.clock += 1
        link.stamp = self.clock
        self.size += 1

    def remove(self, link: Link) -> None:
        """Unlink a listed link."""
        prev, nxt = link.prev, link.next
        assert prev is not None and nxt is not None, "link is not in the list"
        prev.next, nxt.prev = nxt, prev
        link.prev = link.next = None
        self.size -= 1

    def move_mru(self, link: Link) -> None:
        """Move a listed link to the MRU end."""
        self.remove(link)
        self.push_mru(link)

    def touch(self, link: Link) -> None:
        """Move a link to the MRU end, listing it if it is parked (or new)."""
        if link.prev is not None:
            self.remove(link)
        self.push_mru(link)

    def take_place(self, old: Link, new: Link) -> None:
        """Put `new` (unlisted) where the listed `old` is, with old's stamp; `old`
        leaves the list. The order stays sorted by stamp."""
        prev, nxt = old.prev, old.next
        assert prev is not None and nxt is not None, "link is not in the list"
        assert new.prev is None, "link is already in the list"
        prev.next, nxt.prev = new, new
        new.prev, new.next = prev, nxt
        new.stamp = old.stamp
        old.prev = old.next = None

    def splice_mru(self, links: list[Link]) -> None:
        """Move listed links to the MRU end in one pass, links[0] newest: the
        order (and stamp order) of calling move_mru on them from last to first."""
        if not links:
            return
        for link in links:
            prev, nxt = link.prev, link.next
            assert prev is not None and nxt is not None, "link is not in the list"
            prev.next, nxt.prev = nxt, prev
        first = self.head.next
        assert first is not None
        clock = self.clock + len(links)
        self.clock = clock
        prev = self.head
        for link in links:
            prev.next, link.prev = link, prev
            link.stamp = clock
            clock -= 1
            prev = link
        prev.next, first.prev = first, prev

    def lru_unlocked(self, start: Link | None = None) -> Link | None:
        """The least recently used unlocked link, searching from `start`
        (exclusive) towards the MRU end; from the tail when `start` is None."""
        x = (start or self.tail).prev
        head = self.head
        while x is not head and x is not None and x.lock > 0:
            x = x.prev
        return None if x is head else x

    def lru_unlocked_leaf(self, start: Link | None = None) -> Link | None:
        """Like `lru_unlocked`, but only links whose node has no children."""
        x = (start or self.tail).prev
        head = self.head
        while x is not head and x is not None and (x.lock > 0 or x.node.children):  # type: ignore[union-attr]
            x = x.prev
        return None if x is head else x

    def lru_leaf_parking(self) -> Link | None:
        """`lru_unlocked_leaf()`, parking on the way every link older than every leaf
        (an internal node, skipped by every later search until it is listed again)."""
        head = self.head
        x = self.tail.prev
        while x is not head and x is not None and x.node.children:  # type: ignore[union-attr]
            older = x.prev
            self.remove(x)
            x = older
        while x is not head and x is not None and (x.lock > 0 or x.node.children):  # type: ignore[union-attr]
            x = x.prev
        return None if x is head else x

    def __iter__(self) -> Iterator[Link]:
        """Links from MRU to LRU."""
        x = self.head.next
        while x is not None and x is not self.tail:
            yield x
            x = x.next

    def check(self, name: str) -> list[Link]:
        """Verify link symmetry, size and stamp order; return the links MRU first."""
        links: list[Link] = []
        x = self.head
        while x.next is not None:
            nxt = x.next
            if nxt.prev is not x:
                raise AssertionError(f"{name} LRU: broken back link after {x.node!r}")
            if nxt is not self.tail:
                if links and nxt.stamp >= links[-1].stamp:
                    raise AssertionError(f"{name} LRU: {nxt.node!r} is newer than its predecessor")
                links.append(nxt)
            x = nxt
        if x is not self.tail or len(links) != self.size:
            raise AssertionError(f"{name} LRU: size {self.size} but {len(links)} links")
        return links
