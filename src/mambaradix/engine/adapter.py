"""`PoolAdapter`: runs a `transformers` hybrid model on memory that lives in
the project's pools instead of in a `DynamicCache`.

Memory layout (the pools own everything between forwards):

    k, v           [num_attn_layers, kv_tokens, kv_heads, head_dim]  indexed by
                   the KV indices the lifecycle allocates (TokenKVAllocator)
    states         TorchStatePool with, per recurrent layer, the HF cache's own
                   conv state [conv_dim, d_conv] (HF keeps d_conv columns, not
                   d_conv - 1) and recurrent state (Mamba2 [H, head_dim, N],
                   GDN [Hv, dk, dv]), indexed by state slot

Per forward (batch size 1) the adapter assembles a fresh `DynamicCache`:
gathers the request's K/V for positions [0, start) from its row of KV indices,
copies its running slot's conv/SSM states in, runs the model on the new tokens
with explicit `position_ids`, then scatters the new K/V into the pool at the
freshly allocated indices and copies the new states back into the slot.

Cost of this adapter: each forward copies the whole context's K/V out of the
pool, i.e. O(start * num_attn_layers * kv_heads * head_dim) elements, plus one
state slot in and out (O(state bytes), independent of length). For decode
that makes a request's total copy traffic O(T^2) in its length T, on top of
HF's own `torch.cat` of the new K/V onto the gathered context. A real engine
would read the pool in place with a paged-attention kernel; for the tiny
models and few-thousand-token contexts of tests and benches the copy is a
small part of the forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mambaradix.pools.geometry import StateGeometry
from mambaradix.pools.torch_state import TorchStatePool

__all__ = ["PoolAdapter"]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class PoolAdapter:
    """KV tensors + a `TorchStatePool` for `model`, and the forward that uses them.

    The layer layout and state shapes are probed once by running the model on
    one token with a fresh `DynamicCache` (so the shapes are exactly the HF
    cache's own). Layers holding K/V are attention layers; layers holding a
    conv state are recurrent layers. Layers holding both (Zamba2, FalconH1)
    are supported by the same code; layers holding neither (MLP) are skipped.
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
            pos = torch.zeros((1, 1), dtype=torch.long, device=self.device)
            model(input_ids=ids, position_ids=pos, cache=probe, use_cache=True, logits_to_keep=1)
        self.attn_layers: list[int] = []
        self.rec_layers: list[int] = []
        kv_shape: tuple[int, int] | None = None
        conv_shape: tuple[int, ...] | None = None
        ssm_shape: tuple[int, ...] | None = None
        for i, layer in enumerate(probe.layers):
            keys = getattr(layer, "keys", None)
            if isinstance(keys, torch.Tensor):
                self.attn_layers.append(i)
                shape = (int(keys.shape[1]), int(keys.shape[3]))
                if kv_shape not in (None, shape):
                    raise ValueError("attention layers with different K/V shapes")
                kv_shape = shape
            convs = getattr(layer, "conv_states", None)
            if convs:
                if len(convs) != 1 or len(layer.recurrent_states) != 1:
                    raise ValueError("only one conv and one recurrent state per layer")
                c = tuple(int(d) for d in convs[0].shape[1:])
                s = tuple(int(d) for d in layer.recurrent_states[0].shape[1:])
                if (conv_shape, ssm_shape) not in ((None, None), (c, s)):
                    raise ValueError("recurrent layers with different state shapes")
                conv_shape, ssm_shape = c, s
                self.rec_layers.append(i)
        if kv_shape is None or conv_shape is None or ssm_shape is None:
            raise ValueError("the model needs at least one attention and one recurrent layer")
        self.kv_heads, self.head_dim = kv_shape
        pool_shape = (len(self.attn_layers), kv_tokens, self.kv_heads, self.head_dim)
        self.k = torch.zeros(pool_shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros(pool_shape, dtype=self.dtype, device=self.device)
        self.geometry = StateGeometry(
            num_layers=len(self.rec_layers),
            conv_shapes=(conv_shape,),
            ssm_shape=ssm_shape,
            conv_dtype=_dtype_name(self.dtype),
            ssm_dtype=_dtype_name(self.dtype),
        )
        self.states = TorchStatePool(self.geometry, state_slots, device=self.device)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    def _index(self, idx: Sequence[int]) -> torch.Tensor:
        return torch.as_tensor(list(idx), dtype=torch.long, device=self.device)

    @torch.no_grad()
    def forward(
        self,
        tokens: Sequence[int],
        start: int,
        context_kv: Sequence[int],
        new_kv: Sequence[int],
        slot: int,
    ) -> torch.Tensor:
        """Run `tokens` (positions start .. start+n-1) for one request.

        `context_kv`: KV indices of positions [0, start); `new_kv`: the n
        indices the new tokens' K/V are written to; `slot`: the running state
        slot, holding the state after `start` tokens (read, then overwritten).
        Returns the fp32 logits of the last new token, shape [vocab]."""
        n = len(tokens)
        if len(context_kv) != start or len(new_kv) != n or n < 1:
            raise ValueError("context/new KV indices do not match start/tokens")
        cache = self._cache_cls(config=self.config)
        if start > 0:
            ctx = self._index(context_kv)
            k = self.k.index_select(1, ctx).transpose(1, 2)  # [A, H, start, D]
            v = self.v.index_select(1, ctx).transpose(1, 2)
            for a, li in enumerate(self.attn_layers):
                cache.layers[li].update(k[a : a + 1], v[a : a + 1])
            conv_pool, ssm_pool = self.states.conv[0], self.states.ssm
            for r, li in enumerate(self.rec_layers):
                layer = cache.layers[li]
                conv = conv_pool[r, slot].unsqueeze(0)
                ssm = ssm_pool[r, slot].unsqueeze(0)
                layer.lazy_initialization(conv_states=conv, state_idx=0)
                layer.conv_states[0].copy_(conv)
                layer.lazy_initialization(recurrent_states=ssm, state_idx=0)
                layer.recurrent_states[0].copy_(ssm)
                layer.has_previous_state[0] = True
        ids = torch.as_tensor([list(tokens)], dtype=torch.long, device=self.device)
        pos = torch.arange(start, start + n, dtype=torch.long, device=self.device)[None]
        out = self.model(
            input_ids=ids, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1
        )
        new = self._index(new_kv)
        for a, li in enumerate(self.attn_layers):
            layer = cache.layers[li]
            self.k[a].index_copy_(0, new, layer.keys[0, :, start:].transpose(0, 1))
            self.v[a].index_copy_(0, new, layer.values[0, :, start:].transpose(0, 1))
        for r, li in enumerate(self.rec_layers):
            layer = cache.layers[li]
            self.states.conv[0][r, slot].copy_(layer.conv_states[0][0])
            self.states.ssm[r, slot].copy_(layer.recurrent_states[0][0])
        logits: torch.Tensor = out.logits[0, -1].float()
        return logits
