"""SGLang 0.5.15.post1's own KV event module (`srt/disaggregation/kv_events.py`), loaded
from its wheel (see `upstream_sglang.find_wheel`) as a standalone module: it imports only
msgspec, pyzmq and pydantic. Its structs decode our SGLang-format payloads and its
`ZmqEventPublisher` publishes to our subscriber, so both directions are checked against
the consumer's and the producer's real code. Nothing from SGLang is copied here."""

from __future__ import annotations

import glob
import sys
import types
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MEMBER = "sglang/srt/disaggregation/kv_events.py"
_module: types.ModuleType | None = None


def sglang_kv_events() -> types.ModuleType:
    global _module
    if _module is not None:
        return _module
    wheels = sorted(glob.glob(str(REPO_ROOT / ".cache/sglang/sglang-0.5.15.post1-*.whl")))
    if not wheels:
        raise RuntimeError(
            "SGLang 0.5.15.post1 wheel not found under .cache/sglang/: run scripts/setup.sh"
        )
    with zipfile.ZipFile(wheels[-1]) as wheel:
        source = wheel.read(MEMBER)
    module = types.ModuleType("upstream_sglang_kv_events")
    module.__file__ = f"{wheels[-1]}/{MEMBER}"
    sys.modules[module.__name__] = module  # msgspec resolves struct annotations through it
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    _module = module
    return module
