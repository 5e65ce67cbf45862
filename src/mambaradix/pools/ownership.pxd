# The compiled build's declarations for ownership.py (Cython pure-Python mode, docs/build.md,
# "The pools"): `SlotOwners` becomes an extension type, and the short-batch claim and
# release run over the owner map's and the indices' buffers in C. ownership.py stays the
# reference and the pure fallback; editing this file makes every compiled module stale
# (mambaradix/_build.py, source_tag).
cimport cython
from cpython cimport array


@cython.final
cdef class SlotOwners:
    cdef public bytearray owners


@cython.locals(op=cython.p_char, vp=cython.p_longlong, n=Py_ssize_t, size=Py_ssize_t,
               k=Py_ssize_t, j=Py_ssize_t, i=cython.longlong, ok=bint,
               request=cython.char, tree=cython.char, seen=cython.char)
cpdef bint _claim_in_place(bytearray owners, array.array values, Py_ssize_t start,
                           Py_ssize_t keep) except -1

