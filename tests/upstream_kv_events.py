"""Each release's own KV event module, loaded from its wheel under `.cache/` at test time:
vLLM's `vllm/distributed/kv_events.py`, SGLang's `sglang/srt/disaggregation/kv_events.py`.

They import msgspec, pyzmq (and SGLang pydantic) plus a few names from their own
packages; those are stubbed here for the time of the import only (sys.modules is put
back as it was, so a test that loads the real package is not disturbed):

* vLLM: `KVEventsConfig` (0.27+ builds one as a record of its arguments), `init_logger`,
  `ExternalBlockHash` (`bytes | int`, as `v1/core/kv_cache_utils.py` defines it) and
  0.31+'s network helpers (used only to bind `tcp://*:0`, which no test does);
* SGLang: 0.5.19+'s `NetworkAddress` (used only to advertise endpoints) and 0.5.21+'s
  `get_parallel` (used only to pick the publishing rank).

Their structs, encoders and ZMQ publishers run as released. Nothing is copied here.
`scripts/fetch-event-wheels.sh` downloads the wheels.
"""

from __future__ import annotations

import glob
import logging
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

from mambaradix.events.releases import RELEASES

REPO_ROOT = Path(__file__).resolve().parents[1]
MEMBERS = {
    "vllm": "vllm/distributed/kv_events.py",
    "sglang": "sglang/srt/disaggregation/kv_events.py",
}
VLLM = [name for name, r in RELEASES.items() if r.engine == "vllm"]
SGLANG = [name for name, r in RELEASES.items() if r.engine == "sglang"]
_loaded: dict[str, types.ModuleType] = {}


def wheel(name: str) -> Path:
    engine, version = RELEASES[name].engine, name.split("-", 1)[1]
    found = sorted(glob.glob(str(REPO_ROOT / f".cache/{engine}/{engine}-{version}-*.whl")))
    if not found:
        raise RuntimeError(
            f"the {name} wheel is not under .cache/{engine}/: run scripts/fetch-event-wheels.sh"
        )
    return Path(found[-1])


def kv_events(name: str) -> types.ModuleType:
    """Release `name`'s event module (structs, `ZmqEventPublisher`), loaded once."""
    if name in _loaded:
        return _loaded[name]
    path = wheel(name)
    member = MEMBERS[RELEASES[name].engine]
    with zipfile.ZipFile(path) as whl:
        source = whl.read(member)
    module = types.ModuleType("upstream_kv_events_" + name.replace(".", "_").replace("-", "_"))
    module.__file__ = f"{path}/{member}"
    sys.modules[module.__name__] = module  # msgspec resolves struct annotations through it
    stubs = _vllm_stubs() if RELEASES[name].engine == "vllm" else _sglang_stubs()
    saved = {key: sys.modules.get(key) for key in stubs}
    sys.modules.update(stubs)
    try:
        exec(compile(source, module.__file__, "exec"), module.__dict__)
    finally:
        for key, old in saved.items():
            if old is None:
                del sys.modules[key]
            else:
                sys.modules[key] = old
    _loaded[name] = module
    return module


def sglang_kv_events() -> types.ModuleType:
    """SGLang 0.5.15.post1's module (the release the SGLang baselines model)."""
    return kv_events("sglang-0.5.15.post1")


def _package(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so that submodules can be imported from it
    module.__dict__.update(attrs)
    return module


class _Record:
    """Stands for a config class: keeps what it is given."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def _unused(*args: Any, **kw: Any) -> Any:
    raise NotImplementedError("stubbed out by tests/upstream_kv_events.py")


def _vllm_stubs() -> dict[str, types.ModuleType]:
    return {
        "vllm": _package("vllm"),
        "vllm.config": _package("vllm.config"),
        "vllm.config.kv_events": _package("vllm.config.kv_events", KVEventsConfig=_Record),
        "vllm.logger": _package("vllm.logger", init_logger=logging.getLogger),
        "vllm.v1": _package("vllm.v1"),
        "vllm.v1.core": _package("vllm.v1.core"),
        "vllm.v1.core.kv_cache_utils": _package(
            "vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int
        ),
        "vllm.utils": _package("vllm.utils"),
        "vllm.utils.network_utils": _package(
            "vllm.utils.network_utils",
            get_ip=_unused,
            get_tcp_uri=_unused,
            is_valid_ipv6_address=_unused,
            split_zmq_path=_unused,
        ),
    }


def _sglang_stubs() -> dict[str, types.ModuleType]:
    return {
        "sglang": _package("sglang"),
        "sglang.srt": _package("sglang.srt"),
        "sglang.srt.utils": _package("sglang.srt.utils"),
        "sglang.srt.utils.network": _package("sglang.srt.utils.network", NetworkAddress=_Record),
        "sglang.srt.runtime_context": _package("sglang.srt.runtime_context", get_parallel=_unused),
    }
