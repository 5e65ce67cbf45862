"""Every figure a cache needs, derived from a `Geometry`'s layers.

One code path: `layer_cost` costs one block; `figures` sums it over the
layers; `vllm_block` applies vLLM's page unification to the same per-layer
costs.

Standard accounting (``Geometry.accounting == "standard"``)
    * Linear parts: 2 FLOPs per weight touched per token (one multiply-add):
      attention q/k/v/o projections, Mamba / GDN in/out projections, dense
      MLPs, and for MoE the router, the ``top_k`` routed experts and the
      shared expert with its gate. The LM head and the embedding lookup are
      left out (prefill computes logits for the last position only; the
      embedding is a gather), as are norms, activations, RoPE and softmax.
    * Attention scores: QK^T and AV cost ``2 * heads * head_dim`` FLOPs each
      per (query, key) pair, so ``4 * heads * head_dim`` per pair per layer.
    * Short causal conv: ``2 * conv_kernel * conv_dim`` per token.
    * Recurrent scan in the token-by-token form: 6 FLOPs per state element
      per token for Mamba1/Mamba2, 7 for the gated delta rule (see the layer
      classes). The chunked prefill kernels' extra intra-chunk work (order
      ``chunk_size`` per token) is not counted; it is a few percent of a
      layer's projection FLOPs.
    * KV bytes: K and V of every attention layer at the model dtype (both
      SGLang's and vLLM's default ``kv_cache_dtype="auto"``).
    * State bytes: per recurrent layer a conv state ``(conv_dim,
      conv_kernel - 1)`` and an SSM state ``ssm_shape``, at the dtypes of a
      `StateDtypes` convention. Tensor parallelism splits these across ranks;
      figures count the whole model (TP = 1).

Marconi accounting (``"marconi"``): Marconi's released simulator formulas
(github.com/ruipeterpan/marconi utils.py) applied per layer, with
``D = hidden``, ``N = state_size`` and ``e`` the dtype's bytes::

    attention  8*D^2 per token + 4*D per (query, key) pair (full L x L square),
               KV 2*D*e bytes per token
    Mamba      12*D^2 + 16*D*N + 10*D per token,
               state D*N*e + conv_dim*conv_kernel*e bytes
    MLP        16*D^2 per token
"""

from __future__ import annotations

from dataclasses import dataclass

from mambaradix.geometry.layers import (
    MLP,
    RECURRENT_TYPES,
    Attention,
    Layer,
    Mamba2,
    Recurrent,
    conv_shape,
    dtype_bytes,
    ssm_elems,
)
from mambaradix.geometry.model import Geometry, check_geometry

__all__ = [
    "STATE_DTYPES",
    "Figures",
    "check_state_dtype",
    "checkpoint_dtypes",
    "check_dtypes",
    "LayerCost",
    "StateDtypes",
    "engine_state_dtypes",
    "figures",
    "layer_cost",
    "sglang_state_dtypes",
    "state_shapes",
    "uniform_cost",
]


@dataclass(frozen=True)
class StateDtypes:
    """How an engine stores a recurrent state: dtypes, and why.

    ``conv_keeps_kernel``: the conv state keeps all ``conv_kernel`` inputs
    (transformers' cache, hence the mambaradix engine) rather than the
    ``conv_kernel - 1`` that SGLang and vLLM keep.
    """

    conv: str
    ssm: str
    rule: str
    conv_keeps_kernel: bool = False

    def __post_init__(self) -> None:
        dtype_bytes(self.conv, "StateDtypes.conv")
        dtype_bytes(self.ssm, "StateDtypes.ssm")
        if not isinstance(self.conv_keeps_kernel, bool):
            raise TypeError("StateDtypes.conv_keeps_kernel must be a bool")

    @property
    def changes_outputs(self) -> bool:
        """Quantized (int8) checkpoints: a hit resumes from an approximate state,
        so the cached run's outputs differ from an uncached run's."""
        return "int8" in (self.conv, self.ssm)


STATE_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}
STATE_DTYPES |= {"int8": "int8"}
"""``--state-dtype`` spellings -> the dtype checkpoints are stored in ("auto": each
engine's own rule, see `sglang_state_dtypes` and `vllm.vllm_state_dtypes`)."""


def check_state_dtype(choice: object) -> str:
    """`choice` if it is "auto" or a key of `STATE_DTYPES`; ValueError naming
    ``state_dtype`` otherwise."""
    if choice != "auto" and (not isinstance(choice, str) or choice not in STATE_DTYPES):
        known = ", ".join(["auto", *STATE_DTYPES])
        raise ValueError(f"state_dtype must be one of {known}, got {choice!r}")
    return str(choice)


def checkpoint_dtypes(choice: object, base: StateDtypes) -> StateDtypes:
    """`base` (an engine's rule) with conv and SSM states both stored as `choice`
    (a key of `STATE_DTYPES`, or "auto" for `base` itself); ValueError naming
    ``state_dtype`` otherwise."""
    check_dtypes(base, "base")
    name = check_state_dtype(choice)
    if name == "auto":
        return base
    dtype = STATE_DTYPES[name]
    lossy = "; quantized: changes outputs" if dtype == "int8" else ""
    rule = f"checkpoints stored as {dtype} (conv and ssm; --state-dtype {name}){lossy}"
    return StateDtypes(dtype, dtype, rule, base.conv_keeps_kernel)


def check_dtypes(value: object, name: str = "dtypes") -> StateDtypes:
    """`value` if it is a `StateDtypes`; TypeError naming `name` otherwise."""
    if not isinstance(value, StateDtypes):
        raise TypeError(f"{name} must be a StateDtypes, got {type(value).__name__}")
    return value


def sglang_state_dtypes(geom: Geometry) -> StateDtypes:
    """SGLang 0.5.15.post1 ``python/sglang/srt/configs/mamba_utils.py``
    ``mamba2_state_dtype``: conv bf16 (``SGLANG_MAMBA_CONV_DTYPE`` default);
    SSM from the config's ``mamba_ssm_dtype``, else float32
    (``SGLANG_MAMBA_SSM_DTYPE`` unset)."""
    check_geometry(geom)
    ssm = geom.setting("mamba_ssm_dtype")
    why = "the config's mamba_ssm_dtype" if ssm else "default"
    rule = f"SGLang 0.5.15.post1: conv bfloat16, ssm {ssm or 'float32'} ({why})"
    return StateDtypes("bfloat16", ssm or "float32", rule)


def engine_state_dtypes(geom: Geometry) -> StateDtypes:
    """The mambaradix engine's pools: transformers' cache layout (conv keeps
    ``conv_kernel`` inputs), conv and SSM at the model dtype."""
    check_geometry(geom)
    rule = f"engine: conv and ssm at the model dtype {geom.dtype}, conv keeps conv_kernel inputs"
    return StateDtypes(geom.dtype, geom.dtype, rule, conv_keeps_kernel=True)


def state_shapes(layer: Recurrent, dtypes: StateDtypes) -> tuple[tuple[int, int], tuple[int, ...]]:
    """Conv and SSM state shapes of one sequence in `layer`, as `dtypes`' engine keeps them."""
    dim, width = conv_shape(layer)
    return (dim, width + 1 if dtypes.conv_keeps_kernel else width), layer.ssm_shape


@dataclass(frozen=True)
class LayerCost:
    """One block's share of every figure, with the formula behind each."""

    kv_bytes_per_token: int
    state_bytes: int
    linear_flops_per_token: int
    attn_flops_per_pair: int
    formulas: tuple[tuple[str, str], ...]
    """``(figure, formula)`` for the figures this kind of block has."""


def layer_cost(layer: Layer, geom: Geometry, dtypes: StateDtypes) -> LayerCost:
    """Cost of `layer` in `geom` under `geom.accounting` (states at `dtypes`)."""
    if geom.accounting == "marconi":
        return _marconi_cost(layer, geom)
    h = geom.hidden
    if isinstance(layer, Attention):
        kv = layer.kv_elems_per_token * dtype_bytes(geom.dtype)
        q = "2*H*dh [q+gate]" if layer.gated_query else "H*dh"
        return LayerCost(
            kv,
            0,
            2 * layer.params(h),
            4 * layer.heads * layer.head_dim,
            (
                ("kv_bytes_per_token", f"2*KV*dh*{dtype_bytes(geom.dtype)} [{geom.dtype}]"),
                ("linear_flops_per_token", f"2*(hidden*({q} + 2*KV*dh) + H*dh*hidden)"),
                ("flops_per_pair", "4*H*dh (QK^T + AV)"),
            ),
        )
    if isinstance(layer, RECURRENT_TYPES):
        return _recurrent_cost(layer, h, dtypes)
    if isinstance(layer, MLP):
        k = 3 if layer.gated else 2
        return LayerCost(
            0, 0, 2 * layer.params(h), 0, (("linear_flops_per_token", f"2*{k}*hidden*ffn"),)
        )
    formula = (
        "2*(hidden*experts + top_k*k*width*ffn [+ 2*hidden*latent] + k*hidden*shared_ffn "
        "[+ hidden gate]), k = 3 (SwiGLU) or 2"
    )
    return LayerCost(0, 0, 2 * layer.active_params(h), 0, (("linear_flops_per_token", formula),))


def _recurrent_cost(layer: Recurrent, hidden: int, dtypes: StateDtypes) -> LayerCost:
    conv_b, ssm_b = dtype_bytes(dtypes.conv), dtype_bytes(dtypes.ssm)
    (dim, width), _ = state_shapes(layer, dtypes)
    elems = ssm_elems(layer)
    state = dim * width * conv_b + elems * ssm_b
    scan = layer.scan_flops_per_state_elem
    flops = 2 * layer.params(hidden) + 2 * layer.conv_kernel * dim + scan * elems
    shape = "x".join(str(d) for d in layer.ssm_shape) or "none"
    return LayerCost(
        0,
        state,
        flops,
        0,
        (
            (
                "state_bytes",
                f"conv ({dim}x{width})*{conv_b} + ssm ({shape})*{ssm_b}; {dtypes.rule}",
            ),
            ("linear_flops_per_token", f"2*params + 2*conv_kernel*conv_dim + {scan}*ssm_elems"),
        ),
    )


def _marconi_cost(layer: Layer, geom: Geometry) -> LayerCost:
    d, e = geom.hidden, dtype_bytes(geom.dtype)
    if isinstance(layer, Attention):
        return LayerCost(
            2 * d * e,
            0,
            8 * d * d,
            4 * d,
            (
                ("kv_bytes_per_token", "get_kvs_size(1, D) = 2*D*2"),
                ("linear_flops_per_token", "8*D^2 (of get_attn_flops 8*L*D^2)"),
                ("flops_per_pair", "4*D (of 4*L^2*D, full square)"),
            ),
        )
    if isinstance(layer, Mamba2):
        n = layer.state_size
        return LayerCost(
            0,
            d * n * e + layer.conv_dim * layer.conv_kernel * e,
            12 * d * d + 16 * d * n + 10 * d,
            0,
            (
                ("state_bytes", "get_mamba_state_size(D, N) = D*N*2 + (2*D + 2*N)*4*2"),
                ("linear_flops_per_token", "12*D^2 + 16*D*N + 10*D (get_mamba1_flops)"),
            ),
        )
    if isinstance(layer, MLP):
        return LayerCost(
            0, 0, 16 * d * d, 0, (("linear_flops_per_token", "16*D^2 (get_mlp_flops)"),)
        )
    raise ValueError(f"marconi accounting has no formula for a {layer.kind} layer")


@dataclass(frozen=True)
class Figures:
    """Whole-model sums of `layer_cost`."""

    kv_bytes_per_token: int
    state_bytes: int
    linear_flops_per_token: int
    attn_flops_per_pair: int
    causal: bool
    """False under Marconi's accounting (it counts the full L x L square)."""


def figures(geom: Geometry, dtypes: StateDtypes) -> Figures:
    check_geometry(geom)
    check_dtypes(dtypes)
    costs = [layer_cost(x, geom, dtypes) for x in geom.layers]
    return Figures(
        kv_bytes_per_token=sum(c.kv_bytes_per_token for c in costs),
        state_bytes=sum(c.state_bytes for c in costs),
        linear_flops_per_token=sum(c.linear_flops_per_token for c in costs),
        attn_flops_per_pair=sum(c.attn_flops_per_pair for c in costs),
        causal=geom.accounting != "marconi",
    )


def uniform_cost(geom: Geometry, kind: type | tuple[type, ...], dtypes: StateDtypes) -> LayerCost:
    """The one cost every layer of `kind` has; ValueError if they differ or none exist."""
    costs = {layer_cost(x, geom, dtypes) for x in geom.layers if isinstance(x, kind)}
    if len(costs) != 1:
        what = "no such layers" if not costs else "layers of different sizes"
        raise ValueError(f"{geom.name}: {what} for {kind}")
    return costs.pop()
