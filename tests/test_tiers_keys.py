"""Keys: page hashes, namespace seeds, object names, bad input.

The page-hash vectors were printed by SGLang 0.5.23's own C++ extension, compiled from its
wheel (``tests/upstream_hicache.py``: ``upstream_page_hashes(tokens, page_size, prior)``);
the slow test in test_tiers_upstream.py compares random inputs against it live.
"""

from __future__ import annotations

import pytest

import upstream_hicache as upstream
from mambaradix.tiers import KV, MAMBA, Namespace, ObjectKey, chain_seed, layout_tag, page_hashes
from mambaradix.tiers.keys import check_key

# (tokens, page_size, prior) -> SGLang 0.5.23 get_hash_str output
UPSTREAM_VECTORS = [
    (([1, 2, 3, 4, 5], 2, None), [
        "34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f",
        "c57b445f90651b9a650e516ab2238c965b21af35608a31c303e6d9e407f2915c",
        "e1fd781b60f933e64fe17100c521f3130659b4761e25f7b79abcf81ae5aa23cf",  # partial page
    ]),
    (([7, 2**32 + 5, 9], 2, None), [  # a token past uint32: the page is hashed "wide"
        "feb13848634d4875ce8da134d7aa80a28aa08510da448af82c413b9c592b0b3b",
        "9f95a8464fc72570dc66326f3c7e05e7fbdf8164fbfea1a8bc9f8aff2931246e",
    ]),
    (([0], 1, "ab" * 32), ["53a4a6e0391a5c8b78798df206bbf76449f7b794cd2497ebe789abbea1dece94"]),
    (([5, 6, 7, 8], 4, None), ["f3e0813c89d0991f07fbb5027a68c0cb809e1effc0c1e8974664bd2e57b50024"]),
]


@pytest.mark.parametrize(("args", "expected"), UPSTREAM_VECTORS)
def test_page_hashes_equal_sglang_vectors(args, expected):
    assert page_hashes(*args) == expected


def test_chain_continues_from_prior():
    tokens = list(range(100, 164))
    whole = page_hashes(tokens, 16)
    assert page_hashes(tokens[32:], 16, prior=whole[1]) == whole[2:]
    assert page_hashes([], 16) == []


def test_chain_seed_equals_sglang_storage_namespace_seed():
    seed = upstream.storage_namespace_seed()  # run from the wheel's source
    for extra_key, salt in [(None, None), ("lora-a", None), (None, "salt"), ("", ""),
                            ("a", "bc"), ("ab", "c"), ("ü", None)]:
        assert chain_seed(extra_key, salt) == seed(extra_key, salt)


def test_object_names_follow_hicache_file():
    h = page_hashes([1, 2, 3], 3)[0]
    ns = Namespace("nvidia/Nemotron-H-8B", 1, 2)
    assert ns.object_name(ObjectKey(h, KV)) == f"{h}_nvidia-Nemotron-H-8B_1_2"
    assert ns.object_name(ObjectKey(h, MAMBA)) == f"{h}.mamba_nvidia-Nemotron-H-8B_1_2"
    tagged = Namespace("m", layout="l0123abcd")
    assert tagged.object_name(ObjectKey(h, MAMBA)) == f"{h}.mamba_m_0_1_l0123abcd"


def test_layout_tag_names_dtypes_and_shapes():
    a = layout_tag({"conv": ("bfloat16", (4, 8)), "ssm": ("float32", (2, 3))})
    assert a == layout_tag({"ssm": ("float32", (2, 3)), "conv": ("bfloat16", (4, 8))})
    assert a != layout_tag({"conv": ("bfloat16", (4, 8)), "ssm": ("bfloat16", (2, 3))})
    assert a != layout_tag({"conv": ("bfloat16", (8, 4)), "ssm": ("float32", (2, 3))})
    Namespace("m", layout=a)  # a valid tag


@pytest.mark.parametrize(("call", "match"), [
    (lambda: page_hashes([1], 0), "page_size"),
    (lambda: page_hashes([1], True), "page_size"),
    (lambda: page_hashes([-1], 4), "tokens"),
    (lambda: page_hashes([2**63], 4), "tokens"),
    (lambda: page_hashes("abc", 4), "tokens"),
    (lambda: page_hashes([1.0], 4), "tokens"),
    (lambda: page_hashes([1], 4, prior="xyz"), "prior"),
    (lambda: chain_seed(3, None), "extra_key"),  # type: ignore[arg-type]
    (lambda: Namespace(""), "model"),
    (lambda: Namespace("a b"), "model"),
    (lambda: Namespace("m", 2, 2), "tp_rank"),
    (lambda: Namespace("m", 0, 0), "tp_rank"),
    (lambda: Namespace("m", layout="1abc"), "layout"),
    (lambda: Namespace("m", layout="a_b"), "layout"),
    (lambda: check_key(("ab", KV)), "key.page_hash"),
    (lambda: check_key(("a" * 64, "Mamba")), "key.pool"),
    (lambda: check_key("a" * 64), "ObjectKey"),
])
def test_bad_input_names_the_parameter(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call()
