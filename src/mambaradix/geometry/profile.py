"""Model profiles for `mambaradix replay`: bytes and FLOPs a prefix-cache hit saves.

A profile reduces a hybrid model to the numbers a replay needs:

* ``kv_bytes_per_token``: K and V of every attention layer for one token, at
  the model dtype (bf16 for the published models);
* ``state_bytes``: one recurrent-state checkpoint, i.e. the conv state and the
  SSM state of every recurrent (Mamba / Gated DeltaNet) layer, at the
  profile's ``state_dtypes``;
* the prefill cost ``F(L)`` of ``L`` tokens, as a per-token linear part plus
  the attention score term, from which ``prefill_flops`` and ``flops_saved``
  follow;
* vLLM's unified block (``vllm_block_tokens``, and the "all"-mode block) and
  what one state costs there (``vllm_state_bytes``, padded to a page).

Every number is derived from the model's per-layer geometry
(`mambaradix.geometry`): its layers are built from the published
``config.json`` (``nemotron-h-8b``, ``qwen3-next-80b-a3b``,
``jamba-1.5-mini``; values and sources in `mambaradix.geometry.configs`) or
from the engine's presets (``nemotron-h-tiny``, ``qwen3-next-tiny``), and the
formulas are documented once in `mambaradix.geometry.derive` (FLOPs, bytes)
and `mambaradix.geometry.vllm` (vLLM's block). ``marconi-7b`` reproduces the
accounting of Marconi's released simulator, not a real checkpoint.

State dtypes
    The published models' states are counted as SGLang allocates them
    (SGLang 0.5.15.post1 ``python/sglang/srt/configs/mamba_utils.py``
    ``mamba2_state_dtype``): conv in bf16 (``SGLANG_MAMBA_CONV_DTYPE``
    default), SSM in float32 unless the config sets ``mamba_ssm_dtype`` (none
    of the three does). vLLM 0.33.0 keeps Nemotron-H's SSM state in float32
    too (its NemotronH hook) but Qwen3-Next's and Jamba's at the model dtype,
    bf16; ``vllm_state_dtypes`` says which. The engine presets keep every
    state at the model dtype (float32), as the engine's pools do.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mambaradix.geometry import (
    PRESETS as ENGINE_PRESETS,
)
from mambaradix.geometry import (
    Geometry,
    StateDtypes,
    VllmBlock,
    engine_state_dtypes,
    figures,
    layer_cost,
    published,
    sglang_state_dtypes,
    vllm_block,
)
from mambaradix.geometry.configs import (
    JAMBA_15_MINI_CONFIG,
    MARCONI_7B_CONFIG,
    NEMOTRON_H_8B_CONFIG,
    QWEN3_NEXT_80B_A3B_CONFIG,
)
from mambaradix.geometry.derive import check_dtypes, check_state_dtype, checkpoint_dtypes
from mambaradix.geometry.hf import from_config, load_geometry
from mambaradix.geometry.model import check_geometry
from mambaradix.geometry.vllm import vllm_state_dtypes

__all__ = [
    "JAMBA_15_MINI_CONFIG",
    "MARCONI_7B_CONFIG",
    "NEMOTRON_H_8B_CONFIG",
    "PROFILES",
    "QWEN3_NEXT_80B_A3B_CONFIG",
    "ModelProfile",
    "get_profile",
    "load_profile",
    "profile_from_config",
    "profile_from_geometry",
]

Derivation = tuple[tuple[str, int, str], ...]

VLLM_KERNEL_ALIGNMENT = 16
"""vLLM's attention kernel block alignment, used for hand-built profiles."""


def _as_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


@dataclass(frozen=True)
class ModelProfile:
    """Bytes and FLOPs of one model, as a prefix-cache replay needs them.

    The prefill cost of a prompt of ``L`` tokens from scratch is modelled as::

        F(L) = linear_flops_per_token * L + attn_flops_per_pair * pairs(L)
        pairs(L) = L * (L + 1) / 2   if causal   (query p sees keys 0..p)
                 = L * L             otherwise   (Marconi's full-square count)

    and prefilling ``new`` tokens after ``context`` cached ones costs
    ``F(context + new) - F(context)``: the linear part of the new tokens plus
    their scores against all ``context + new`` keys (for ``causal=False`` also
    the old queries against the new keys, as Marconi counts it).

    Profiles of real models come from `profile_from_geometry`. A hand-built
    profile (no ``geometry``) leaves the vLLM fields at 0 and gets them as
    for a model of one attention and one recurrent layer: the block is
    ``16 * cdiv(state_bytes, 16 * kv_bytes_per_token)`` tokens.
    """

    name: str
    source: str
    """Where each number comes from (URL / repo + commit + file), human-readable."""
    kv_bytes_per_token: int
    """K and V of all attention layers for one token, at the model's KV dtype."""
    state_bytes: int
    """One checkpoint: conv + SSM state of every recurrent layer."""
    linear_flops_per_token: int
    """All per-token FLOPs that do not depend on the context length, summed over layers."""
    attn_flops_per_pair: int
    """Attention FLOPs per (query, key) pair, summed over attention layers."""
    causal: bool = True
    notes: str = ""
    derivation: Derivation = ()
    """``(key, value, formula)`` of the intermediate numbers, for `describe`."""
    vllm_block_tokens: int = 0
    """vLLM's unified attention block in tokens ("align" mode; `geometry.vllm`)."""
    vllm_all_block_tokens: int = 0
    """The block under vLLM 0.20.0's ``mamba_cache_mode="all"``."""
    vllm_state_bytes: int = 0
    """One state as vLLM holds it: a padded page per recurrent layer."""
    geometry: Geometry | None = None
    """The layer list every number above was derived from (None if hand-built)."""
    state_dtypes: StateDtypes | None = None
    """The dtypes ``state_bytes`` counts the state in."""
    vllm_state_dtypes: StateDtypes | None = None
    """The dtypes vLLM keeps the state in (``vllm_state_bytes``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("name must be a non-empty str")
        if not isinstance(self.causal, bool):
            raise TypeError(f"causal must be a bool, got {type(self.causal).__name__}")
        for field_name in (
            "kv_bytes_per_token",
            "state_bytes",
            "linear_flops_per_token",
            "attn_flops_per_pair",
            "vllm_block_tokens",
            "vllm_all_block_tokens",
            "vllm_state_bytes",
        ):
            _as_count(getattr(self, field_name), field_name)
        if not self.vllm_block_tokens:
            a = VLLM_KERNEL_ALIGNMENT
            block = a * max(1, -(-self.state_bytes // (a * max(1, self.kv_bytes_per_token))))
            object.__setattr__(self, "vllm_block_tokens", block)
        if not self.vllm_all_block_tokens:
            object.__setattr__(self, "vllm_all_block_tokens", self.vllm_block_tokens)
        if not self.vllm_state_bytes:
            padded = self.vllm_block_tokens * self.kv_bytes_per_token
            object.__setattr__(self, "vllm_state_bytes", max(self.state_bytes, padded))

    def _pairs(self, length: int) -> int:
        return length * (length + 1) // 2 if self.causal else length * length

    def _forward_flops(self, length: int) -> int:
        return self.linear_flops_per_token * length + self.attn_flops_per_pair * self._pairs(length)

    def _prefill(self, context: int, new: int) -> int:
        return self._forward_flops(context + new) - self._forward_flops(context)

    def prefill_flops(self, context: int, new: int) -> float:
        """FLOPs to prefill `new` tokens after `context` cached ones (per-layer sums).

        Includes the attention scores of the new queries over all
        ``context + new`` keys. ``prefill_flops(c, 0) == 0``.
        """
        c = _as_count(context, "context")
        n = _as_count(new, "new")
        return float(self._prefill(c, n))

    def flops_saved(self, hit: int, total: int) -> float:
        """FLOPs a hit of `hit` cached tokens saves on a `total`-token prompt.

        ``prefill_flops(0, total) - prefill_flops(hit, total - hit)``, which
        equals ``F(hit)``: the cost of prefilling the hit prefix from scratch.
        """
        h = _as_count(hit, "hit")
        t = _as_count(total, "total")
        if h > t:
            raise ValueError(f"hit ({h}) must be <= total ({t})")
        return float(self._prefill(0, t) - self._prefill(h, t - h))

    def describe(self) -> dict[str, tuple[int, str]]:
        """The derived numbers, each as ``(value, formula)``.

        Contains the intermediate numbers of the derivation (layer counts,
        per-layer bytes and FLOPs, vLLM's pages) followed by the profile's own
        fields and the marginal prefill cost of one token at context 0 and 8192.
        """
        out: dict[str, tuple[int, str]] = {
            key: (value, formula) for key, value, formula in self.derivation
        }
        pairs = "L*(L+1)/2" if self.causal else "L*L"
        out["kv_bytes_per_token"] = (self.kv_bytes_per_token, "sum over attention layers")
        out["state_bytes"] = (self.state_bytes, "sum over recurrent layers")
        out["linear_flops_per_token"] = (self.linear_flops_per_token, "sum over layers")
        out["attn_flops_per_pair"] = (
            self.attn_flops_per_pair,
            f"sum over attention layers; F(L) = linear_flops_per_token*L"
            f" + attn_flops_per_pair*{pairs}",
        )
        out["vllm_block_tokens"] = (self.vllm_block_tokens, "vLLM's unified block (align mode)")
        out["vllm_state_bytes"] = (self.vllm_state_bytes, "recurrent layers x padded page")
        for ctx in (0, 8192):
            out[f"flops_per_token_at_context_{ctx}"] = (
                self._prefill(ctx, 1),
                f"prefill_flops({ctx}, 1) = F({ctx}+1) - F({ctx})",
            )
        return out


# ---------------------------------------------------------------------------
# From a geometry
# ---------------------------------------------------------------------------

_FIGURE = {
    "kv_bytes_per_token": "kv_bytes_per_token",
    "state_bytes": "state_bytes",
    "linear_flops_per_token": "linear_flops_per_token",
    "flops_per_pair": "attn_flops_per_pair",
}


def _derivation(geom: Geometry, dtypes: StateDtypes, vb: VllmBlock) -> Derivation:
    """Layer counts and each distinct layer's figures, then vLLM's pages."""
    groups = Counter(geom.layers)
    per_kind = Counter(layer.kind for layer in groups)
    seen: Counter[str] = Counter()
    out: list[tuple[str, int, str]] = []
    for layer, count in groups.items():
        seen[layer.kind] += 1
        key = layer.kind if per_kind[layer.kind] == 1 else f"{layer.kind}{seen[layer.kind]}"
        out.append((f"{key}_layers", count, f"{layer!r}"))
        cost = layer_cost(layer, geom, dtypes)
        for figure, formula in cost.formulas:
            out.append((f"{key}_{figure}_per_layer", getattr(cost, _FIGURE[figure]), formula))
    page = f"MambaSpec; {vb.dtypes.rule}"
    if geom.accounting == "marconi":
        page = "Marconi's get_mamba_state_size"
    out += [
        (
            "vllm_attention_page_bytes_per_token_per_layer",
            vb.attention_page_per_token,
            "FullAttentionSpec(block_size=1).page_size_bytes",
        ),
        ("vllm_mamba_page_bytes_per_layer", vb.mamba_page, page),
        (
            "vllm_block_alignment",
            vb.alignment,
            "kernel block alignment (lcm GDN checkpoint grid in align mode)",
        ),
        (
            "vllm_all_block_tokens",
            vb.all_mode_tokens,
            "vLLM 0.20.0 mamba_cache_mode='all': lcm(chunk, 16)-aligned"
            if vb.all_mode_supported
            else "no 'all' mode for this model: vLLM falls back to align",
        ),
    ]
    return tuple(out)


def profile_from_geometry(
    geom: Geometry,
    state_dtypes: StateDtypes | None = None,
    notes: str = "",
    vllm_dtypes: StateDtypes | None = None,
) -> ModelProfile:
    """The profile of `geom`, states counted at `state_dtypes` (SGLang's by
    default) and in vLLM's block at `vllm_dtypes` (vLLM's own rule by default)."""
    check_geometry(geom)
    dtypes = (
        check_dtypes(state_dtypes, "state_dtypes")
        if state_dtypes is not None
        else sglang_state_dtypes(geom)
    )
    if vllm_dtypes is not None:
        check_dtypes(vllm_dtypes, "vllm_dtypes")
    figs = figures(geom, dtypes)
    vb = vllm_block(geom, dtypes=vllm_dtypes)
    return ModelProfile(
        name=geom.name,
        source=f"{geom.source} State dtypes: {dtypes.rule}; {vb.dtypes.rule}.",
        kv_bytes_per_token=figs.kv_bytes_per_token,
        state_bytes=figs.state_bytes,
        linear_flops_per_token=figs.linear_flops_per_token,
        attn_flops_per_pair=figs.attn_flops_per_pair,
        causal=figs.causal,
        notes=notes,
        derivation=_derivation(geom, dtypes, vb),
        vllm_block_tokens=vb.tokens,
        vllm_all_block_tokens=vb.all_mode_tokens,
        vllm_state_bytes=vb.state_bytes,
        geometry=geom,
        state_dtypes=dtypes,
        vllm_state_dtypes=vb.dtypes,
    )


def _marconi_7b(geom: Geometry) -> ModelProfile:
    """Marconi's 7B Attention-Mamba2 layout, with its simulator's accounting verbatim.

    Per layer, for a sequence of ``L`` tokens (``D`` = d_model, ``N`` = d_state)::

        attention  8*L*D^2 + 4*L^2*D   FLOPs,  KV 2*L*D*2 bytes
        MLP        16*L*D^2            FLOPs
        Mamba      12*L*D^2 + 16*L*D*N + 10*L*D FLOPs,
                   state D*N*2 + (2*D + 2*N)*4*2 bytes

    giving 4*2*D*2 = 65,536 KV bytes per token and
    24*(D*N*2 + (2D+2N)*8) = 26,787,840 bytes (about 26.8 MB) per checkpoint.
    ``flops_saved(hit, total)`` is the sum of the per-layer formulas at ``L = hit``,
    as Marconi credits a hit. vLLM's block is vLLM's rule applied to this
    accounting's pages (2*D*2 bytes per token per attention layer, the state
    above per Mamba layer): 16 * cdiv(1,116,160, 16 * 16,384) = 80 tokens.

    Where this accounting departs from the real model (kept on purpose, for
    comparability with Marconi's numbers):

    * SSM state ``D*N`` ignores Mamba2's expand factor: the real state has
      ``d_inner*N = 2*D*N`` elements, and engines keep it in fp32 (SGLang), so
      the real SSM state is 2x (fp16) to 4x (fp32) the accounted one.
    * Conv state: counts ``conv_kernel`` (4) columns where engines keep
      ``conv_kernel - 1`` (3), over ``2D + 2N`` channels, i.e. ``d_inner +
      2*N`` assuming ``n_groups = 1``; Mamba2 uses ``d_inner + 2*n_groups*N``.
    * KV ``2*L*D*2`` assumes full multi-head attention (K and V of width D);
      a GQA model stores ``2*kv_heads*head_dim`` per layer instead.
    * Mamba FLOPs are the Mamba1 formula (``get_mamba1_flops``: "The FLOPs for
      a Mamba2 layer is similar"), with expand fixed at 2; Mamba2's grouped B/C
      and head-wise dt differ. The submission version used ``10*L`` instead of
      ``10*L*D``; this profile uses the camera-ready ``10*L*D``.
    * ``4*L^2*D`` counts the full ``L x L`` score matrix (QK^T and AV), not the
      causal half, so the marginal attention cost of a token at context ``c``
      is ``4*D*(2c+1)`` per layer, about twice the causal count. Hence
      ``causal=False`` here.
    * MLP ``16*L*D^2`` assumes a non-gated ``4D`` FFN.
    * The simulator's eviction scoring (``radix_cache_hybrid.py`` in
      github.com/ruipeterpan/marconi) credits MLP savings with
      ``get_attn_flops`` instead of ``get_mlp_flops``; this profile uses the
      MLP formula, i.e. the intended value.
    """
    fp16 = StateDtypes(geom.dtype, geom.dtype, "Marconi accounting: fp16 throughout")
    return profile_from_geometry(
        geom,
        fp16,
        notes="Marconi simulator accounting (fp16, full-square attention); see _marconi_7b.",
    )


_NOTES = {
    "nemotron-h-8b": "Scan FLOPs in recurrent form (6 per state element); SSD intra-chunk "
    "work omitted.",
    "qwen3-next-80b-a3b": "Scan FLOPs in recurrent form (7 per state element); chunked-kernel "
    "extra omitted.",
    "jamba-1.5-mini": "Scan FLOPs in recurrent form (6 per state element).",
}


def _profiles() -> dict[str, ModelProfile]:
    out: dict[str, ModelProfile] = {}
    for name, geom in published().items():
        if geom.accounting == "marconi":
            out[name] = _marconi_7b(geom)
        else:
            out[name] = profile_from_geometry(geom, notes=_NOTES.get(name, ""))
    for name, preset in ENGINE_PRESETS.items():
        geom = preset.geometry
        out[name] = profile_from_geometry(geom, engine_state_dtypes(geom), "engine preset")
    return out


PROFILES: dict[str, ModelProfile] = _profiles()
"""Profiles by CLI key."""


def unit_profile() -> ModelProfile:
    """A profile of one byte per KV token and per state, one FLOP per token and per
    attention pair (pool sizes in bytes then are counts)."""
    return ModelProfile("unit", "1 byte per KV token and per state", 1, 1, 1, 1)


def get_profile(name: str) -> ModelProfile:
    """The profile called `name`; KeyError listing the known names otherwise."""
    try:
        return PROFILES[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(PROFILES))
        raise KeyError(f"unknown model profile {name!r}; known: {known}") from None


# ---------------------------------------------------------------------------
# By name, from a config, or with other state dtypes
# ---------------------------------------------------------------------------


def _with_state_dtype(profile: ModelProfile, state_dtype: str) -> ModelProfile:
    """`profile` with checkpoints stored as `state_dtype` (`geometry.checkpoint_dtypes`),
    in SGLang's count and in vLLM's block alike."""
    geom = profile.geometry
    if check_state_dtype(state_dtype) == "auto":
        return profile
    if geom is None or profile.state_dtypes is None or geom.accounting == "marconi":
        raise ValueError(
            f"state_dtype: {profile.name} has a fixed accounting (no per-layer state dtypes)"
        )
    dtypes = checkpoint_dtypes(state_dtype, profile.state_dtypes)
    vllm = checkpoint_dtypes(state_dtype, profile.vllm_state_dtypes or vllm_state_dtypes(geom))
    notes = profile.notes
    if dtypes.changes_outputs:
        notes = f"{notes} int8 state checkpoints: a hit changes outputs.".strip()
    return profile_from_geometry(geom, dtypes, notes, vllm)


def profile_from_config(
    cfg: Mapping[str, object] | str | os.PathLike[str],
    *,
    name: str | None = None,
    state_dtype: str = "auto",
) -> ModelProfile:
    """The profile of a Hugging Face config: a dict (``config.json`` contents or
    ``transformers.<Family>Config(...).to_dict()``), a ``config.json`` path or a
    directory holding one (`geometry.hf`). States as SGLang and vLLM store
    them, or all at `state_dtype` (``float32``, ``bfloat16``, ``int8``; int8
    checkpoints change outputs). ValueError / TypeError naming the key otherwise."""
    if isinstance(cfg, Mapping):
        geom = from_config(cfg, name)
    elif isinstance(cfg, (str, os.PathLike)):
        geom = load_geometry(cfg, name)
    else:
        raise TypeError(f"cfg must be a config dict or a path, got {type(cfg).__name__}")
    return _with_state_dtype(profile_from_geometry(geom, notes="from its config"), state_dtype)


def load_profile(
    model: str | os.PathLike[str] | ModelProfile, state_dtype: str = "auto"
) -> ModelProfile:
    """A built-in profile by name (`PROFILES`), or `profile_from_config` of a
    ``config.json`` path or a directory holding one; `state_dtype` as there.
    KeyError listing the names when `model` is neither a name nor a path."""
    if isinstance(model, ModelProfile):
        return _with_state_dtype(model, state_dtype)
    if isinstance(model, str) and model in PROFILES:
        return _with_state_dtype(PROFILES[model], state_dtype)
    if isinstance(model, (str, os.PathLike)) and Path(model).exists():
        return profile_from_config(model, state_dtype=state_dtype)
    known = ", ".join(sorted(PROFILES))
    raise KeyError(
        f"unknown model profile {str(model)!r}; known: {known}; or give a config.json "
        "path or a directory holding one"
    )
