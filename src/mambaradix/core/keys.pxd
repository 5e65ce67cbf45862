# The compiled build's declarations for keys.py (docs/build.md, node.pxd).
cimport cython


@cython.locals(n=Py_ssize_t, lo=Py_ssize_t, hi=Py_ssize_t, step=Py_ssize_t, mid=Py_ssize_t)
cpdef Py_ssize_t common_prefix_len(object edge, object tokens, Py_ssize_t off) except -1
