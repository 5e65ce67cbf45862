"""Run vLLM 0.33.0's own KV cache manager on CPU, for the differential tests of the ``vllm`` policy.

Nothing from vLLM is copied into this repository. At run time this module opens the vLLM
wheel (a dev/test-only download, see ``find_wheel``), extracts the pure-Python files below
into ``.cache/vllm/src/<wheel>/`` and executes them as the real modules:

* ``vllm/v1/core/kv_cache_manager.py``            -- ``KVCacheManager``, the class under comparison;
* ``vllm/v1/core/kv_cache_coordinator.py``        -- the hybrid coordinator (hit search, junction);
* ``vllm/v1/core/single_type_kv_cache_manager.py``-- the attention and Mamba ("align") managers;
* ``vllm/v1/core/block_pool.py``                  -- the block pool and its hash map;
* ``vllm/v1/core/kv_cache_utils.py``              -- ``FreeKVCacheBlockQueue``, block hashing;
* ``vllm/v1/kv_cache_interface.py``               -- the specs, the checkpoint-position helpers;
* ``vllm/v1/request.py``                          -- ``Request`` (block hashes, token counts);
* ``vllm/v1/core/sched/scheduler.py``             -- for ``Scheduler._mamba_block_aligned_split``;
* ``vllm/utils/math_utils.py``, ``vllm/utils/hashing.py``, ``vllm/v1/kv_cache_layout.py``,
  ``vllm/v1/kv_cache_spec_registry.py``, ``vllm/v1/attention/backends/registry.py``.

Every other ``vllm.*`` module those files import is server, GPU or front-end machinery that the
paths we drive never run: an import hook answers it with a stand-in module whose attributes are
empty stand-in classes (so module-level imports, base classes and enum look-ups succeed).
Five stand-ins carry behaviour, each a data helper the paths we drive do call:

* ``vllm.v1.utils.ConstantList``: a read-only view of a list (``Request.all_token_ids``);
* ``StructuredOutputRequest.from_sampling_params``: None (no structured output);
* ``vllm.utils.length_from_prompt_token_ids_or_embeds``: ``len(prompt_token_ids)``;
* ``vllm.logger.init_logger``: ``logging.getLogger``;
* ``SamplingParams``: ``_Sampling`` below (``max_tokens``, no extra arguments).

``cbor2`` (imported by ``vllm/utils/hashing.py`` for a hash we do not use) is a stand-in too.
Block hashes are vLLM's own (``get_request_block_hasher`` with ``sha256``).

``UpstreamVllm`` drives one ``KVCacheManager`` the way vLLM's ``Scheduler.schedule`` and
``update_from_output`` drive it for one request at a time (``serve``), with the chunk split of
the real ``Scheduler._mamba_block_aligned_split`` (called on a stand-in holding the scheduler
fields it reads). ``vllm_split`` calls that function alone, for the split's own test.

Note: the stand-ins occupy the ``vllm`` package name in ``sys.modules`` for the life of the
process, so do not import a real vLLM install in the same process.
"""

from __future__ import annotations

import collections.abc
import glob
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import types
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

VLLM_VERSION = "0.33.0"
REPO_ROOT = Path(__file__).resolve().parents[1]
WHEEL_ENV = "MAMBARADIX_VLLM_WHEEL"

_REAL_MODULES = (
    "vllm.utils.math_utils",
    "vllm.utils.hashing",
    "vllm.v1.kv_cache_layout",
    "vllm.v1.kv_cache_spec_registry",
    "vllm.v1.attention.backends.registry",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.request",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.block_pool",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.sched.scheduler",
)
_PACKAGES = frozenset(
    ".".join(name.split(".")[:i]) for name in _REAL_MODULES for i in range(1, name.count(".") + 1)
)

_loaded: types.SimpleNamespace | None = None


# --------------------------------------------------------------------------- wheel


def find_wheel() -> Path:
    """The vLLM wheel: ``$MAMBARADIX_VLLM_WHEEL``, else ``.cache/vllm/vllm-<ver>-*.whl``."""
    env = os.environ.get(WHEEL_ENV)
    if env:
        candidates = [Path(env)]
    else:
        pattern = str(REPO_ROOT / ".cache" / "vllm" / f"vllm-{VLLM_VERSION}-*.whl")
        candidates = [Path(p) for p in sorted(glob.glob(pattern))]
    for path in candidates:
        if path.is_file():
            return path
    where = env if env else f"{REPO_ROOT}/.cache/vllm/vllm-{VLLM_VERSION}-*.whl"
    raise RuntimeError(
        f"vLLM {VLLM_VERSION} wheel not found (looked for {where}). The upstream comparison "
        f"needs it; fetch it from the repository root with\n"
        f"    .venv/bin/python -m pip download vllm=={VLLM_VERSION} --no-deps -d .cache/vllm\n"
        f"or set {WHEEL_ENV} to the wheel's path."
    )


def _extract(wheel: Path) -> Path:
    """Extract the real modules once; returns the folder holding ``vllm/``."""
    root = REPO_ROOT / ".cache" / "vllm" / "src" / wheel.stem
    with zipfile.ZipFile(wheel) as zf:
        for name in _REAL_MODULES:
            member = name.replace(".", "/") + ".py"
            target = root / member
            if target.is_file():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(zf.read(member))
            os.replace(tmp, target)  # atomic, so concurrent test workers are safe
    return root


# --------------------------------------------------------------------------- stand-ins


class _StandIn(type):
    """Metaclass of stand-in classes: any attribute is another stand-in class."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _StandIn(name, (), {"__init__": _ignore})
        setattr(cls, name, value)
        return value


def _ignore(self: Any, *args: Any, **kwargs: Any) -> None:
    pass


class _StandInModule(types.ModuleType):
    """A ``vllm.*`` module the driven paths never run: every attribute is a stand-in class,
    except the submodules we load for real."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        if full in _REAL_MODULES or full in _PACKAGES:
            return importlib.import_module(full)
        value = _StandIn(name, (), {"__init__": _ignore, "__module__": self.__name__})
        setattr(self, name, value)
        return value


class _Importer(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the real modules from the extracted files and a stand-in for any other
    ``vllm.*`` module (and ``cbor2``)."""

    def __init__(self, src_root: Path) -> None:
        self.src_root = src_root

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "cbor2" and fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        if fullname in _REAL_MODULES:
            file = self.src_root / (fullname.replace(".", "/") + ".py")
            return importlib.util.spec_from_file_location(fullname, file)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name, "Stand-in module built by tests/upstream_vllm.py")
        module.__path__ = []
        module.__mambaradix_stub__ = True  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _ConstantList(collections.abc.Sequence):  # type: ignore[type-arg]
    """Stand-in for ``vllm.v1.utils.ConstantList``: a read-only view of a list."""

    def __init__(self, items: list[Any]) -> None:
        self._items = items

    def __getitem__(self, i: Any) -> Any:
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)


class _NoStructuredOutput:
    @staticmethod
    def from_sampling_params(sampling_params: Any) -> None:
        return None


class _Sampling:
    """Stand-in for ``SamplingParams``: only the fields ``Request`` reads."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.extra_args = None
        self.skip_reading_prefix_cache = None


def load_upstream() -> types.SimpleNamespace:
    """Import the real modules (once per process); returns them by short name."""
    global _loaded
    if _loaded is not None:
        return _loaded
    existing = sys.modules.get("vllm")
    if existing is not None and not getattr(existing, "__mambaradix_stub__", False):
        raise RuntimeError("a real `vllm` is already imported; the harness needs its own stubs")
    sys.meta_path.insert(0, _Importer(_extract(find_wheel())))
    importlib.import_module("vllm.v1.utils").ConstantList = _ConstantList
    importlib.import_module(
        "vllm.v1.structured_output.request"
    ).StructuredOutputRequest = _NoStructuredOutput
    importlib.import_module("vllm.utils").length_from_prompt_token_ids_or_embeds = (
        lambda ids, embeds: len(ids)
    )
    importlib.import_module("vllm.logger").init_logger = logging.getLogger
    mods = {name.rsplit(".", 1)[1]: importlib.import_module(name) for name in _REAL_MODULES}
    mods["kv_cache_utils"].init_none_hash(mods["hashing"].sha256)
    _loaded = types.SimpleNamespace(**mods)
    return _loaded


# --------------------------------------------------------------------------- the split


class _SplitFields:
    """Stand-in ``self`` for ``Scheduler._mamba_block_aligned_split``: the scheduler fields it
    reads, set as ``Scheduler.__init__`` sets them for a hybrid model in align mode without
    speculative decoding, KV connector or ``prefix_match_unit`` (scheduler.py:430-463)."""

    def __init__(self, block: int, chunk: int, checkpoint_alignment: int | None) -> None:
        self.cache_config = types.SimpleNamespace(block_size=block)
        self.block_size = self.hash_block_size = block
        self.mamba_partial_cache_hit = False  # hash_block_size == block_size
        self.mamba_shared_prefix_checkpoint = False
        self.use_eagle_block_drop = False
        self.num_hash_lookahead_tokens = 0
        self.mamba_has_prefill_checkpoint_blocks = checkpoint_alignment is not None
        self.mamba_prefill_checkpoint_alignment = checkpoint_alignment
        self.max_num_scheduled_tokens = chunk
        self.scheduler_config = types.SimpleNamespace(long_prefill_token_threshold=0)


class _SplitRequest:
    """The request fields the split reads."""

    def __init__(self, prompt: int, tokens: int, computed: int, junction: int) -> None:
        self.num_prompt_tokens = prompt
        self.num_tokens = tokens
        self.num_computed_tokens = computed
        self.shared_prefix_boundary = junction


def vllm_split(
    block: int,
    chunk: int,
    checkpoint_alignment: int | None,
    prompt: int,
    tokens: int,
    computed: int,
    new_tokens: int,
    hit: int = 0,
    junction: int = 0,
) -> int:
    """vLLM's own ``Scheduler._mamba_block_aligned_split``: how many of ``new_tokens`` the
    step schedules for a request of ``tokens`` tokens (``prompt`` of them prompt) that has
    ``computed`` computed and ``hit`` more just hit, with junction ``junction``."""
    up = load_upstream()
    fields = _SplitFields(block, chunk, checkpoint_alignment)
    req = _SplitRequest(prompt, tokens, computed, junction)
    n: int = up.scheduler.Scheduler._mamba_block_aligned_split(fields, req, new_tokens, hit, 0)
    return n


# --------------------------------------------------------------------------- the manager


class UpstreamVllm:
    """vLLM 0.33.0's ``KVCacheManager`` for a hybrid model, defaults as the engine sets them:
    prefix caching on, Mamba cache mode "align", one block size ``block`` for every group
    (hash block = scheduler block = ``block``), ``prefix_cache_retention_interval`` =
    ``retention`` (0, the default; None for dense), one full-attention group and
    ``mamba_groups`` Mamba groups, each Mamba group exporting its prefill checkpoint
    (``num_prefill_checkpoint_blocks=1``, alignment ``checkpoint_alignment``: 1 for Mamba2
    layers, ``mamba_mixer2.py:1108-1118``; None for layers that cannot). The pool holds
    ``num_blocks`` blocks, block 0 being vLLM's null block.

    ``serve(prompt, outputs)`` runs one request alone, start to finish, and returns the tokens
    it hit (None when the manager refuses to admit it)."""

    def __init__(
        self,
        block: int,
        num_blocks: int,
        chunk: int,
        mamba_groups: int = 1,
        retention: int | None = 0,
        checkpoint_alignment: int | None = 1,
    ) -> None:
        up = load_upstream()
        ki = up.kv_cache_interface
        self.block, self.chunk = block, chunk
        attention = ki.FullAttentionSpec(
            block_size=block, num_kv_heads=1, head_size=8, dtype=torch.float32
        )
        ckpt = {"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 1}
        if checkpoint_alignment is None:
            ckpt = {}
        else:
            ckpt["prefill_checkpoint_alignment"] = checkpoint_alignment
        mamba = ki.MambaSpec(
            block_size=block,
            shapes=((4,),),
            dtypes=(torch.float32,),
            mamba_cache_mode="align",
            **ckpt,
        )
        groups = [ki.KVCacheGroupSpec(["attn.0"], attention)]
        groups += [ki.KVCacheGroupSpec([f"mamba.{i}"], mamba) for i in range(mamba_groups)]
        config = ki.KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=groups,
            prefix_cache_retention_interval=retention,
        )
        self.manager = up.kv_cache_manager.KVCacheManager(
            config,
            max_model_len=1 << 30,
            scheduler_block_size=block,
            hash_block_size=block,
            enable_caching=True,
        )
        self._split = _SplitFields(block, chunk, checkpoint_alignment)
        self._hasher = up.kv_cache_utils.get_request_block_hasher(block, up.hashing.sha256)
        self._Request = up.request.Request
        self._finished = up.request.RequestStatus.FINISHED_LENGTH_CAPPED
        self._split_fn = up.scheduler.Scheduler._mamba_block_aligned_split
        self.served = 0
        self.steps: list[tuple[int, int]] = []  # (computed before, scheduled) of the last serve

    @property
    def free_blocks(self) -> int:
        return int(self.manager.block_pool.get_num_free_blocks())

    def serve(self, prompt: Sequence[int], outputs: Sequence[int]) -> int | None:
        """One request alone, as ``Scheduler.schedule`` (admission: scheduler.py:1110-1127,
        1306-1345, 1435-1450; running: 838-918) and ``update_from_output`` drive it with no
        other request in flight: each step calls ``new_step_starts`` (744), schedules
        ``min(remaining, chunk)`` tokens cut by the Mamba split, allocates their slots,
        advances ``num_computed_tokens`` (``_update_after_schedule``, 1856) and, once every
        known token is computed, appends the next output token (a sampled token); after the
        last one the request is freed (``_free_request`` -> ``KVCacheManager.free``)."""
        if not outputs:
            raise ValueError("outputs: a request generates at least one token")
        mgr, req_id = self.manager, f"r{self.served}"
        self.served += 1
        self.steps = []
        req = self._Request(
            req_id, list(prompt), _Sampling(len(outputs)), None, block_hasher=self._hasher
        )
        mgr.new_step_starts()
        blocks, hit, req.shared_prefix_boundary = mgr.get_computed_blocks(req)
        n = self._split_fn(self._split, req, min(req.num_tokens - hit, self.chunk), hit, 0)
        got = mgr.allocate_slots(
            req,
            n,
            num_new_computed_tokens=hit,
            new_computed_blocks=blocks,
            full_sequence_must_fit=True,  # scheduler_reserve_full_isl, on by default
            has_scheduled_reqs=False,
        )
        if got is None:
            return None
        self.steps.append((hit, n))
        req.num_computed_tokens = hit + n
        while True:
            if req.num_computed_tokens >= req.num_tokens:  # this step sampled a token
                req.append_output_token_ids(int(outputs[req.num_output_tokens]))
                if req.num_output_tokens >= len(outputs):
                    break
            mgr.new_step_starts()
            n = min(req.num_tokens - req.num_computed_tokens, self.chunk)
            n = self._split_fn(self._split, req, n)
            if mgr.allocate_slots(req, n) is None:
                raise RuntimeError(
                    f"request {req_id} ran out of blocks alone ({self.free_blocks} free): "
                    "vLLM would preempt it; size the pool for the stream"
                )
            self.steps.append((req.num_computed_tokens, n))
            req.num_computed_tokens += n
        req.status = self._finished
        mgr.free(req)
        return int(hit)
