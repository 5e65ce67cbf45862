# The compiled build's declarations for _freelist.py (Cython pure-Python mode, docs/build.md,
# "The pools"): `FreeStack` becomes an extension type whose fields are C struct members,
# and the short-batch loops run over the flags' and the ids' buffers in C. _freelist.py
# stays the reference and the pure fallback; editing this file makes every compiled module
# stale (mambaradix/_build.py, source_tag).
cimport cython
from cpython cimport array


@cython.final
cdef class FreeStack:
    cdef public Py_ssize_t _size
    cdef public str _noun
    cdef public array.array _stack
    cdef public bytearray _flags
    cdef public object _scratch


@cython.locals(fp=cython.p_char, ip=cython.p_longlong, n=Py_ssize_t, k=Py_ssize_t,
               i=cython.longlong)
cpdef bint _flag_freed_in_place(bytearray flags, array.array ids, Py_ssize_t size) except -1

@cython.locals(fp=cython.p_char, ip=cython.p_longlong, n=Py_ssize_t, k=Py_ssize_t,
               size=Py_ssize_t)
cpdef bint set_in_place(bytearray flags, array.array ids, char value) except -1
