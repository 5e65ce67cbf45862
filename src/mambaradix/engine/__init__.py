"""A reference engine serving real hybrid models from `transformers` on the
prefix cache (needs the `engine` extra):

    >>> from mambaradix.engine import Engine
    >>> eng = Engine(model="nemotron-h-tiny", seed=0, prefix_cache=True)
    >>> results = eng.generate([[1, 2, 3], [1, 2, 4]], max_new_tokens=4)
    >>> results[0].output_ids, results[1].cached_tokens, eng.stats()["hit_rate"]

Modules: `engine` (`Engine`: the scheduler, the cache and the model
together), `config` (`EngineConfig`: its settings, frozen and checked once;
`Engine.from_config`), `forward` (the scheduler's forward: one forward per prefill chunk,
one per decode step for every decoding sequence), `adapter` (a `DynamicCache`
reading and writing the pools), `deterministic` (the grid checkpoints of
`deterministic=True`), `device` (device and dtype checks), `models` (tiny
presets), `workload` (multi-turn conversations driven by the engine's own
answers).
"""

from __future__ import annotations

from mambaradix.engine.config import EngineConfig
from mambaradix.engine.engine import Engine, Result
from mambaradix.engine.models import PRESETS, build_model

__all__ = ["PRESETS", "Engine", "EngineConfig", "Result", "build_model"]
