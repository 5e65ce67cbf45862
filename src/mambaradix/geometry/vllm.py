"""vLLM's unified block for a hybrid model, computed as vLLM computes it.

Reference: vLLM 0.33.0 (PyPI wheel; ``vllm/_version.py`` commit g4ba787ec9),
``--enable-prefix-caching`` (which sets ``mamba_cache_mode="align"``),
default cache dtypes (``"auto"``), TP = 1, no speculative decoding, on a
CUDA GPU of compute capability 9.0 (H100 / H200) with the FlashAttention or
FlashInfer attention backend. ``vllm/platforms/interface.py``
``Platform._align_hybrid_block_size``:

1. Attention page of one token, per layer: ``FullAttentionSpec(block_size=1)
   .page_size_bytes`` = ``kv_heads * (head_size + head_size_v) * bytes`` at the
   KV dtype (``cache_dtype="auto"``: the model dtype).
2. Mamba page, per recurrent layer: ``MambaSpec.page_size_bytes`` = the sum
   of ``prod(shape) * bytes`` over the conv and temporal (SSM) states, shapes
   from ``mamba_utils.MambaStateShapeCalculator`` (the same element counts as
   `layers`: conv ``(conv_dim, K - 1)``), dtypes from `vllm_state_dtypes`.
3. Kernel alignment: ``max(min(backend kernel block sizes), block_size)`` =
   16 (FlashAttention ``MultipleOf(16)``, FlashInfer's smallest 16, default
   ``block_size`` 16). In align mode it is raised to its lcm with the Mamba
   layers' prefill checkpoint alignment: Gated DeltaNet layers prefilled by
   FlashInfer (the default on SM90, ``qwen_gdn_linear_attn.py``
   ``_resolve_gdn_prefill_backend``) checkpoint on a 64-token grid
   (``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT``, ``v1/attention/backends/
   gdn_attn.py``); Mamba1/Mamba2 layers declare none.
4. ``block = align * cdiv(mamba_page, align * attn_page_1_token)``; every
   Mamba page is padded up to ``block * attn_page_1_token`` bytes.

``mamba_cache_mode="all"`` (a state at every block boundary) is gone from
0.33.0 (``MambaCacheMode = Literal["align", "none"]``). In vLLM 0.20.0 it was
the default with prefix caching for models marked
``SupportsMambaPrefixCaching`` (NemotronH and Jamba among them; not
Qwen3-Next, which fell back to "align"), with the block aligned to the
Mamba chunk: ``c * cdiv(cdiv(mamba_page, attn_page_1_token), c)``,
``c = lcm(chunk, 16)``, chunk = the config's ``mamba_chunk_size`` /
``chunk_size``, else 2048 (``ModelConfig.get_mamba_chunk_size``).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import lcm

from mambaradix.geometry.derive import StateDtypes, check_dtypes, uniform_cost
from mambaradix.geometry.layers import RECURRENT_TYPES, Attention, GatedDeltaNet, Mamba2
from mambaradix.geometry.model import Geometry, check_geometry

__all__ = [
    "ALL_MODE_ARCHITECTURES",
    "GDN_CHECKPOINT_ALIGNMENT",
    "KERNEL_ALIGNMENT",
    "VllmBlock",
    "vllm_block",
    "vllm_state_dtypes",
]

KERNEL_ALIGNMENT = 16
"""Attention kernel block alignment (FlashAttention / FlashInfer on SM90)."""

GDN_CHECKPOINT_ALIGNMENT = 64
"""FlashInfer GDN prefill checkpoint grid (align mode, SM90)."""

ALL_MODE_CHUNK_DEFAULT = 2048
"""vLLM 0.20.0 ``get_mamba_chunk_size`` when the config names no chunk."""

ALL_MODE_ARCHITECTURES = frozenset(
    {
        "BambaForCausalLM",
        "FalconH1ForCausalLM",
        "GraniteMoeHybridForCausalLM",
        "JambaForCausalLM",
        "MambaForCausalLM",
        "Mamba2ForCausalLM",
        "NemotronHForCausalLM",
        "Zamba2ForCausalLM",
    }
)
"""Architectures vLLM 0.20.0 marks ``SupportsMambaPrefixCaching``."""


def vllm_state_dtypes(geom: Geometry) -> StateDtypes:
    """The dtypes vLLM 0.33.0 stores a state in, with the reason.

    ``MambaStateDtypeCalculator._mamba_state_dtype``: conv at
    ``mamba_cache_dtype`` ("auto": the model dtype); temporal at
    ``mamba_ssm_cache_dtype``, "auto" meaning the conv dtype. Per-model hooks
    (``vllm/model_executor/models/config.py``) replace "auto" first:
    ``NemotronHForCausalLMConfig`` with the config's ``mamba_ssm_cache_dtype``,
    else float32 ("Only float32 is known to have no accuracy issues by
    default"); ``Qwen3_5*Config`` with the config's ``mamba_ssm_dtype``.
    Qwen3-Next and Jamba have no hook.
    """
    check_geometry(geom)
    arch, model = geom.architecture, geom.dtype
    if arch in ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM"):
        ssm = geom.setting("mamba_ssm_cache_dtype")
        why = "the config's mamba_ssm_cache_dtype" if ssm else "NemotronH hook default"
        rule = f"vLLM 0.33.0: conv {model}, ssm {ssm or 'float32'} ({why})"
        return StateDtypes(model, ssm or "float32", rule)
    if arch.startswith("Qwen3_5") and geom.setting("mamba_ssm_dtype"):
        ssm = geom.setting("mamba_ssm_dtype") or model
        rule = f"vLLM 0.33.0: conv {model}, ssm {ssm} (the config's mamba_ssm_dtype)"
        return StateDtypes(model, ssm, rule)
    return StateDtypes(model, model, f"vLLM 0.33.0: conv and ssm {model} (model dtype, 'auto')")


@dataclass(frozen=True)
class VllmBlock:
    """vLLM's unified block and page sizes for one model."""

    tokens: int
    """Attention block size in tokens ("align" mode)."""
    attention_page_per_token: int
    """Bytes one token takes in one attention layer."""
    mamba_page: int
    """Bytes of one recurrent layer's state, before padding."""
    alignment: int
    """The block is a multiple of this (kernel and checkpoint alignment)."""
    attention_layers: int
    recurrent_layers: int
    dtypes: StateDtypes
    all_mode_tokens: int
    """The block under vLLM 0.20.0's "all" mode (= `tokens` where unsupported)."""
    all_mode_supported: bool
    group_size: int = 1
    """Layers per KV cache group; one block id costs ``group_size`` pages
    (``v1/core/kv_cache_planning.py:509-555``)."""
    attention_groups: int = 1
    mamba_groups: int = 1
    """A state takes one block in every Mamba group (``block_pool.py:202-228``)."""
    checkpoint_alignment: int | None = None
    """The Mamba layers' prefill checkpoint alignment: the forward exports the state at
    the last block boundary of a prefill step (Mamba2 1, ``mamba_mixer2.py:1108-1118``;
    FlashInfer GDN the block, ``qwen_gdn_linear_attn.py:739-760``); None where a layer
    cannot (Mamba1), and the scheduler then ends a step there."""

    @property
    def page_bytes(self) -> int:
        """Bytes of one page: one layer's block of KV, or one padded state."""
        return self.tokens * self.attention_page_per_token

    @property
    def state_bytes(self) -> int:
        """One state checkpoint as vLLM holds it: a padded page per recurrent layer."""
        return self.recurrent_layers * self.page_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.attention_layers * self.attention_page_per_token


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def vllm_block(
    geom: Geometry,
    *,
    dtypes: StateDtypes | None = None,
    kernel_alignment: int = KERNEL_ALIGNMENT,
    gdn_checkpoint_alignment: int | None = GDN_CHECKPOINT_ALIGNMENT,
) -> VllmBlock:
    """vLLM's block for `geom` (see the module doc); `dtypes` defaults to
    `vllm_state_dtypes`. ``gdn_checkpoint_alignment=None`` models a GPU
    without FlashInfer GDN prefill (e.g. SM80), where GDN layers declare none."""
    checks = (
        ("kernel_alignment", kernel_alignment),
        ("gdn_checkpoint_alignment", gdn_checkpoint_alignment),
    )
    for key, value in checks:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{key} must be an int, got {type(value).__name__}")
        if value is not None and value < 1:
            raise ValueError(f"{key} must be >= 1, got {value}")
    check_geometry(geom)
    dt = check_dtypes(dtypes) if dtypes is not None else vllm_state_dtypes(geom)
    attn = uniform_cost(geom, Attention, dt).kv_bytes_per_token
    mamba = uniform_cost(geom, RECURRENT_TYPES, dt).state_bytes
    align = kernel_alignment
    rec = geom.recurrent
    if gdn_checkpoint_alignment and all(isinstance(x, GatedDeltaNet) for x in rec):
        align = lcm(align, gdn_checkpoint_alignment)
    tokens = align * _cdiv(mamba, align * attn)
    supported = geom.architecture in ALL_MODE_ARCHITECTURES
    group, attention_groups, mamba_groups = _groups(len(geom.attention), len(rec))
    chunk = lcm(geom.mamba_chunk_size or ALL_MODE_CHUNK_DEFAULT, kernel_alignment)
    all_tokens = chunk * _cdiv(_cdiv(mamba, attn), chunk) if supported else tokens
    return VllmBlock(
        tokens=tokens,
        attention_page_per_token=attn,
        mamba_page=mamba,
        alignment=align,
        attention_layers=len(geom.attention),
        recurrent_layers=len(rec),
        dtypes=dt,
        all_mode_tokens=all_tokens,
        all_mode_supported=supported,
        group_size=group,
        attention_groups=attention_groups,
        mamba_groups=mamba_groups,
        checkpoint_alignment=_checkpoint_alignment(rec, tokens, gdn_checkpoint_alignment),
    )


def _groups(attention: int, recurrent: int) -> tuple[int, int, int]:
    """``_get_kv_cache_groups_uniform_page_size``: the group size is the smaller layer
    count, or the larger when it is under 1.5 times the smaller (padding the other);
    returns (group size, attention groups, Mamba groups)."""
    counts = [c for c in (attention, recurrent) if c]
    group = min(counts)
    if max(counts) < group * 1.5:
        group = max(counts)
    return group, _cdiv(attention, group), _cdiv(recurrent, group)


def _checkpoint_alignment(
    rec: tuple[object, ...], tokens: int, gdn_alignment: int | None
) -> int | None:
    """Mamba2 layers export at any offset (1); FlashInfer GDN layers on the block grid
    (``get_mamba_prefill_checkpoint_grid`` without ``prefix_match_unit``); otherwise none.
    The scheduler takes exported checkpoints only when every Mamba layer can."""
    if all(isinstance(x, Mamba2) for x in rec):
        return 1
    if gdn_alignment and all(isinstance(x, GatedDeltaNet) for x in rec):
        return tokens
    return None
