"""Serving requests through a CacheManager with a stand-in model.

`FingerprintStatePool` plays the model: running tokens folds them into the
request's slot fingerprint. `serve_request` drives one admitted request through
the whole lifecycle; the demo and the tests build on it.
"""

from __future__ import annotations

from mambaradix.lifecycle import CacheManager, Request
from mambaradix.pools import FingerprintStatePool


def run_tokens(mgr: CacheManager, pool: FingerprintStatePool, req: Request, n: int) -> bool:
    """Allocate KV for and "compute" the next n tokens. False if KV ran out."""
    start = req.computed
    if mgr.extend(req, n) is None:
        return False
    assert req.slot is not None
    pool.advance(req.slot, req.tokens[start : req.computed])
    return True


def serve_request(mgr: CacheManager, pool: FingerprintStatePool, req: Request, chunk: int) -> bool:
    """Prefill in chunks (checkpointing at each stop), decode the request's
    output tokens, finish. Returns False, with the request still admitted, if
    KV ran out (the caller aborts or retries)."""
    for stop in mgr.plan_prefill(req, chunk):
        if not run_tokens(mgr, pool, req, stop - req.computed):
            return False
        mgr.cache_unfinished(req)
    while req.computed < len(req.input_ids) + len(req.output_ids) - 1:
        if not run_tokens(mgr, pool, req, 1):
            return False
    mgr.finish(req)
    return True
