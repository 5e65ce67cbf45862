"""A reference engine serving real hybrid models from `transformers` on the
prefix cache (needs the `engine` extra):

    >>> from mambaradix.engine import Engine
    >>> eng = Engine(model="nemotron-h-tiny", seed=0, prefix_cache=True)
    >>> results = eng.generate([[1, 2, 3], [1, 2, 4]], max_new_tokens=4)
    >>> results[0].output_ids, results[1].cached_tokens, eng.stats()["hit_rate"]

Modules: `engine` (the scheduler and lifecycle driver), `adapter` (pools <->
`DynamicCache` per forward), `models` (tiny presets), `workload` (multi-turn
conversations driven by the engine's own answers).
"""

from __future__ import annotations

from mambaradix.engine.engine import Engine, Result
from mambaradix.engine.models import PRESETS, build_model

__all__ = ["PRESETS", "Engine", "Result", "build_model"]
