# The compiled build's declarations for lru.py (docs/build.md, node.pxd): an extension
# type whose moves are C calls on typed links.
cimport cython
from mambaradix.core.node cimport Link, TreeNode


@cython.final
cdef class LRUList:
    cdef public Link head
    cdef public Link tail
    cdef public Py_ssize_t size
    cdef public Py_ssize_t clock

    @cython.locals(first=Link)
    cpdef push_mru(self, Link link)

    @cython.locals(prev=Link, nxt=Link)
    cpdef remove(self, Link link)

    cpdef move_mru(self, Link link)

    cpdef touch(self, Link link)

    @cython.locals(prev=Link, nxt=Link)
    cpdef take_place(self, Link old, Link new)

    @cython.locals(link=Link, prev=Link, nxt=Link, first=Link, clock=Py_ssize_t)
    cpdef splice_mru(self, list links)

    @cython.locals(x=Link, head=Link)
    cpdef Link lru_unlocked(self, Link start=*)

    @cython.locals(x=Link, head=Link)
    cpdef Link lru_unlocked_leaf(self, Link start=*)

    @cython.locals(x=Link, head=Link, older=Link)
    cpdef Link lru_leaf_parking(self)
