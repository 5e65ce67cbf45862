# The compiled build's declarations for node.py (Cython pure-Python mode, docs/build.md):
# `Link` and `TreeNode` become extension types whose fields are C struct members, read
# and written without a dictionary or descriptor lookup by code that knows the type.
# node.py stays the reference and the pure fallback; editing this file makes every
# compiled module stale (mambaradix/_build.py, source_tag).
cimport cython

cdef class TreeNode


@cython.final
cdef class Link:
    cdef public Link prev
    cdef public Link next
    cdef public TreeNode node
    cdef public Py_ssize_t lock
    cdef public Py_ssize_t stamp


@cython.final
cdef class TreeNode:
    cdef public TreeNode parent
    cdef public dict children
    cdef public object key
    cdef public object value
    cdef public object state
    cdef public object namespace
    cdef public Link kv
    cdef public Link st
    cdef public Py_ssize_t id

    @cython.locals(n=Py_ssize_t, node=TreeNode)
    cpdef Py_ssize_t depth_tokens(self) except -1
