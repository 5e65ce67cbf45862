# The compiled build's declarations for tree.py (docs/build.md, node.pxd): the hot loops,
# module functions of tree.py, with typed locals. MambaRadixCache itself stays an
# ordinary class (subclassed, pickled through vars(), its __class__ swapped by the
# thread guard), compiled as it is.
cimport cython
from cpython cimport array
from mambaradix.core.node cimport Link, TreeNode
from mambaradix.core.lru cimport LRUList


cpdef bint _edge_matches(object edge, object tokens, Py_ssize_t off) except -1

@cython.locals(e=array.array, t=array.array, n=Py_ssize_t, i=Py_ssize_t, ep=cython.p_longlong,
               tp=cython.p_longlong)
cpdef bint _edge_matches_in_place(object edge, object tokens, Py_ssize_t off) except -1

@cython.locals(m=Py_ssize_t)
cpdef Py_ssize_t _match_len(object edge, object tokens, Py_ssize_t off, Py_ssize_t page) except -1

@cython.locals(page=Py_ssize_t, n=Py_ssize_t, off=Py_ssize_t, ln=Py_ssize_t, m=Py_ssize_t,
               node=TreeNode, child=TreeNode, path=list)
cpdef tuple _walk_path(object cache, object tokens, object extra_key, bint split)

@cython.locals(page=Py_ssize_t, n=Py_ssize_t, off=Py_ssize_t, ln=Py_ssize_t, m=Py_ssize_t,
               split_at=Py_ssize_t, node=TreeNode, child=TreeNode, walked=list)
cpdef tuple _insert_walk(object cache, object tokens, object values, Py_ssize_t prev,
                         object extra_key)

@cython.locals(k=Py_ssize_t, node=TreeNode)
cpdef Py_ssize_t _state_depth(list path) except -1

@cython.locals(i=Py_ssize_t, node=TreeNode)
cpdef object _path_values(list path, Py_ssize_t k)

@cython.locals(i=Py_ssize_t, node=TreeNode, total=Py_ssize_t, at=Py_ssize_t, n=Py_ssize_t,
               out=array.array, v=array.array)
cpdef object _path_values_in_place(list path, Py_ssize_t k)

@cython.locals(last=TreeNode)
cpdef _refresh_path(LRUList kv_lru, LRUList st_lru, list path, Py_ssize_t k, bint lazy,
                    bint sglang)

@cython.locals(last=TreeNode)
cpdef _refresh_walked(LRUList kv_lru, LRUList st_lru, list walked, bint lazy, bint sglang)

@cython.locals(i=Py_ssize_t, node=TreeNode, kv_links=list, st_links=list)
cpdef _splice_deepest_first(LRUList kv_lru, LRUList st_lru, list path, Py_ssize_t k,
                            bint sglang)

@cython.locals(moved=Py_ssize_t, x=TreeNode, y=TreeNode, link=Link, lock=Py_ssize_t)
cpdef object _path_locks(TreeNode root, TreeNode node, Py_ssize_t delta)

@cython.locals(lru=LRUList, lazy=bint, got=Py_ssize_t, tokens=Py_ssize_t, x=Link, nxt=Link,
               node=TreeNode, survivor=TreeNode)
cpdef Py_ssize_t _evict_kv_leaves(object cache, object want, object freed_kv,
                                  list freed_states) except -1  # want: any int (evict(10**30))

@cython.locals(parent=TreeNode, grandparent=TreeNode, tokens=Py_ssize_t)
cpdef tuple _delete_leaf(object cache, TreeNode leaf, object freed_kv, list freed_states)

@cython.locals(parent=TreeNode, kv_lru=LRUList)
cpdef Py_ssize_t _detach(object cache, TreeNode node, object freed_kv) except -1

@cython.locals(leaf=TreeNode, kv_lru=LRUList, st_lru=LRUList)
cpdef TreeNode _add_leaf(object cache, TreeNode parent, object tokens, object values,
                         Py_ssize_t off, object state, object extra_key)
