"""`PoolAdapter`: runs a `transformers` hybrid model on memory that lives in
the project's pools instead of in a `DynamicCache`.

Memory layout (the pools own everything between forwards, all on one device):

    k, v           [num_attn_layers, kv_tokens, kv_heads, head_dim]  indexed by
                   the KV indices the lifecycle allocates (TokenKVAllocator)
    states         TorchStatePool with, per recurrent layer, the HF cache's own
                   conv state [conv_dim, d_conv] (HF keeps d_conv columns, not
                   d_conv - 1) and recurrent state (Mamba2 [H, head_dim, N],
                   GDN [Hv, dk, dv]), at the dtypes the model itself keeps
                   them (probed: e.g. a float32 SSM state in a bfloat16 model)

One forward runs B sequences, each extending n tokens (a prefill chunk: B = 1;
a decode step: n = 1, B = the running batch). Sequence b's tokens sit at
positions starts[b] .. starts[b] + n - 1, and row b of `kv_index` holds the KV
indices of its positions 0 .. starts[b] + n - 1 (right-padded with any valid
index up to the longest row). A `DynamicCache` is built whose attention layers
read and write the pool directly (`_PoolKV`): the new K/V are scattered into
the pool at their KV indices, then the layer's keys are ONE gather of the
rows of `kv_index` ([B, L] -> [B, H, L, D]); an explicit mask hides the
padding (and, in a chunk, the future). That gather is the only copy of the
context per forward and per layer: the same amount HF's own `DynamicCache`
copies when it concatenates the new K/V onto the old (a paged-attention
kernel would read the pool in place). The recurrent layers get their states
as views of the slot (B = 1: read and updated in place) or gathered by slot
and scattered back (B > 1): O(B x state bytes), independent of length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from mambaradix.pools.geometry import StateGeometry
from mambaradix.pools.torch_state import TorchStatePool

__all__ = ["PoolAdapter"]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _PoolKV:
    """A cache layer's `update`, on the pool: write the new K/V at `write`
    (flat, B * n indices), return the keys/values of `read` ([B, L])."""

    def __init__(
        self, k: torch.Tensor, v: torch.Tensor, write: torch.Tensor, read: torch.Tensor
    ) -> None:
        self.k, self.v, self.write, self.read = k, v, write, read

    def __call__(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, h, n, d = key_states.shape
        self.k.index_copy_(0, self.write, key_states.transpose(1, 2).reshape(b * n, h, d))
        self.v.index_copy_(0, self.write, value_states.transpose(1, 2).reshape(b * n, h, d))
        flat = self.read.view(-1)
        rows, length = self.read.shape
        keys = self.k.index_select(0, flat).view(rows, length, h, d).transpose(1, 2)
        values = self.v.index_select(0, flat).view(rows, length, h, d).transpose(1, 2)
        return keys, values


class PoolAdapter:
    """KV tensors + a `TorchStatePool` for `model`, and the forward that uses them.

    The layer layout and state shapes and dtypes are probed once by running
    the model on one token with a fresh `DynamicCache` (so they are exactly
    the HF cache's own). Layers holding K/V are attention layers; layers
    holding a conv state are recurrent layers. Layers holding both (Zamba2,
    FalconH1) are handled by the same code; layers holding neither (MLP) are
    skipped. Everything lives on the model's device.
    """

    def __init__(self, model: Any, kv_tokens: int, state_slots: int) -> None:
        from transformers import DynamicCache

        self.model = model
        self.config = model.config
        self.device = next(model.parameters()).device
        self.dtype: torch.dtype = next(model.parameters()).dtype
        self._cache_cls: Any = DynamicCache  # typed as Any: layers are duck-typed below
        probe: Any = DynamicCache(config=self.config)
        with torch.no_grad():
            ids = torch.zeros((1, 1), dtype=torch.long, device=self.device)
            model(input_ids=ids, position_ids=ids, cache=probe, use_cache=True, logits_to_keep=1)
        self.attn_layers, self.rec_layers = _layer_kinds(probe)
        keys = probe.layers[self.attn_layers[0]].keys
        self.kv_heads, self.head_dim = int(keys.shape[1]), int(keys.shape[3])
        pool_shape = (len(self.attn_layers), kv_tokens, self.kv_heads, self.head_dim)
        self.k = torch.zeros(pool_shape, dtype=keys.dtype, device=self.device)
        self.v = torch.zeros(pool_shape, dtype=keys.dtype, device=self.device)
        first = probe.layers[self.rec_layers[0]]
        conv, ssm = first.conv_states[0], first.recurrent_states[0]
        self.geometry = StateGeometry(
            num_layers=len(self.rec_layers),
            conv_shapes=(tuple(int(d) for d in conv.shape[1:]),),
            ssm_shape=tuple(int(d) for d in ssm.shape[1:]),
            conv_dtype=_dtype_name(conv.dtype),
            ssm_dtype=_dtype_name(ssm.dtype),
        )
        self.states = TorchStatePool(self.geometry, state_slots, device=self.device)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @torch.no_grad()
    def forward(
        self,
        tokens: Sequence[Sequence[int]],
        starts: Sequence[int],
        kv_index: npt.NDArray[np.int64],
        slots: Sequence[int],
    ) -> torch.Tensor:
        """Run B sequences of n new tokens each (see the module docstring).

        `tokens[b]`: the n tokens of sequence b, at positions starts[b] ..;
        `kv_index` [B, >= max(starts) + n]: row b's KV indices from position
        0; `slots[b]`: b's running state slot, holding the state after
        starts[b] tokens (read, then overwritten with the state after
        starts[b] + n). Every start must be 0 or every start > 0. Returns the
        fp32 logits of each sequence's last token, [B, vocab]."""
        b, n = len(tokens), len(tokens[0])
        length = max(starts) + n
        if n < 1 or any(len(t) != n for t in tokens) or not len(starts) == len(slots) == b:
            raise ValueError("tokens, starts and slots must describe B sequences of n tokens")
        if kv_index.shape[0] != b or kv_index.shape[1] < length:
            raise ValueError(f"kv_index must be [{b}, >= {length}], got {kv_index.shape}")
        fresh = starts[0] == 0
        if any((s == 0) != fresh for s in starts):
            raise ValueError("every start must be 0, or every start > 0")
        ids, offsets, read, slot_idx = self._inputs(tokens, starts, kv_index[:, :length], slots)
        write = read.gather(1, offsets).view(-1)
        cache = self._cache_cls(config=self.config)
        for a, li in enumerate(self.attn_layers):
            cache.layers[li].update = _PoolKV(self.k[a], self.v[a], write, read)
        buffers = self._load_states(cache, slots, slot_idx, fresh)
        mask = None if fresh or (n == 1 and min(starts) == max(starts)) else _mask(offsets, length)
        out = self.model(
            input_ids=ids,
            position_ids=offsets,
            attention_mask={"full_attention": mask, "linear_attention": None},
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        if buffers is not None:  # a batch: scatter the gathered states back
            self.states.conv[0].index_copy_(1, slot_idx, buffers[0])
            self.states.ssm.index_copy_(1, slot_idx, buffers[1])
        logits: torch.Tensor = out.logits[:, -1].float()
        return logits

    def _inputs(
        self,
        tokens: Sequence[Sequence[int]],
        starts: Sequence[int],
        kv_index: npt.NDArray[np.int64],
        slots: Sequence[int],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids [B, n], positions [B, n], KV indices [B, L], slots [B]) on the
        device, moved in one host-to-device copy."""
        b, length = kv_index.shape
        n = len(tokens[0])
        host = np.concatenate(
            [
                np.asarray(tokens, dtype=np.int64).reshape(-1),
                np.asarray(starts, dtype=np.int64)[:, None] + np.arange(n, dtype=np.int64),
                kv_index,
                np.asarray(slots, dtype=np.int64)[:, None],
            ],
            axis=None,
        )
        dev = torch.from_numpy(host).to(self.device)
        bn = b * n
        ids, pos = dev[:bn].view(b, n), dev[bn : 2 * bn].view(b, n)
        return ids, pos, dev[2 * bn : -b].view(b, length), dev[-b:]

    def _load_states(
        self, cache: Any, slots: Sequence[int], slot_idx: torch.Tensor, fresh: bool
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Hand each recurrent layer its slots' states: views of the pool for
        one sequence (updated in place; returns None), else copies gathered
        for all layers at once (returned, to be scattered back)."""
        if len(slots) == 1:
            conv = self.states.conv[0][:, slots[0] : slots[0] + 1]
            ssm = self.states.ssm[:, slots[0] : slots[0] + 1]
            buffers = None
        else:
            conv = self.states.conv[0].index_select(1, slot_idx)
            ssm = self.states.ssm.index_select(1, slot_idx)
            buffers = (conv, ssm)
        for r, li in enumerate(self.rec_layers):
            layer = cache.layers[li]
            layer.conv_states[0], layer.recurrent_states[0] = conv[r], ssm[r]
            layer.is_conv_states_initialized[0] = layer.is_recurrent_states_initialized[0] = True
            layer.conv_kernel_size[0] = int(conv.shape[-1])
            layer.device, layer.dtype = conv.device, conv.dtype
            layer.has_previous_state[0] = not fresh
        return buffers


def _mask(offsets: torch.Tensor, length: int) -> torch.Tensor:
    """[B, 1, n, L] bool: query at position p sees keys at positions <= p
    (hides the chunk's future and the padding beyond each row)."""
    keys = torch.arange(length, device=offsets.device)
    return (keys[None, None, :] <= offsets[:, :, None])[:, None]


def _layer_kinds(probe: Any) -> tuple[list[int], list[int]]:
    """(attention layers, recurrent layers) of a probed cache; ValueError
    unless all attention layers share one K/V shape and all recurrent layers
    one conv and one recurrent state shape."""
    attn: list[int] = []
    rec: list[int] = []
    kv_shapes, state_shapes = set(), set()
    for i, layer in enumerate(probe.layers):
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor):
            attn.append(i)
            kv_shapes.add((keys.shape[1], keys.shape[3], keys.dtype))
        convs = getattr(layer, "conv_states", None)
        if convs and convs[0] is not None:
            if len(convs) != 1 or len(layer.recurrent_states) != 1:
                raise ValueError("only one conv and one recurrent state per layer")
            c, s = convs[0], layer.recurrent_states[0]
            state_shapes.add((c.shape[1:], c.dtype, s.shape[1:], s.dtype))
            rec.append(i)
    if not attn or not rec:
        raise ValueError(
            "model must be a hybrid model, with attention and recurrent layers; this one has "
            f"{len(attn)} attention and {len(rec)} recurrent layers"
        )
    if len(kv_shapes) != 1:
        raise ValueError("attention layers with different K/V shapes")
    if len(state_shapes) != 1:
        raise ValueError("recurrent layers with different state shapes")
    return attn, rec
