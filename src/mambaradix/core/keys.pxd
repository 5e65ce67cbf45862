# The compiled build's declarations for keys.py (docs/build.md, node.pxd).
cimport cython
from cpython cimport array


@cython.locals(n=Py_ssize_t, lo=Py_ssize_t, hi=Py_ssize_t, step=Py_ssize_t, mid=Py_ssize_t)
cpdef Py_ssize_t common_prefix_len(object edge, object tokens, Py_ssize_t off) except? -1

@cython.locals(e=array.array, t=array.array, n=Py_ssize_t, i=Py_ssize_t, ep=cython.p_longlong,
               tp=cython.p_longlong)
cpdef Py_ssize_t _common_prefix_len_in_place(object edge, object tokens,
                                             Py_ssize_t off) except? -1
