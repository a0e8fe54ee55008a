"""Named cache layouts (docs/CONTRACTS.md "Named layouts") through a real CPU daemon and the
Python client: one case per op with a cache tensor, run with the layout unset and named (by name,
prefixed name and enum value), each checked against the fp64 reference; a contradicting layout
and a value outside the enum answer INVALID_ARGUMENT naming the layout field; GetInfo and
`attnctl info` list each op's layouts."""

import json
import subprocess

import grpc
import pytest

import attnd_client as ac
from attnd_client.ops import cache_layout_value

import cases

# op, case arguments, layout field, the cache's layout, a layout its dtype/shape contradicts, and
# what the error says the tensor is.
CASES = [
    ("sparse_mla", {"kv_format": "fp8"}, "kv_layout", "FLASHMLA_FP8_656", "BF16_576", "kv is u8"),
    ("sparse_mla", {"d_qk": 512}, "kv_layout", "BF16_512", "BF16_576", "kv is bf16"),
    ("mla_decode", {}, "kv_cache_layout", "BF16_576", "BF16_512", "kv_cache is bf16"),
    # The per-tensor FP8 caches (vLLM's kv_cache_dtype "fp8"), built by its writer's rules.
    (
        "sparse_mla",
        {"kv_format": "fp8_per_tensor"},
        "kv_layout",
        "FP8_576_PER_TENSOR",
        "FLASHMLA_FP8_656",
        "kv is u8 with last dim 576",
    ),
    (
        "sparse_mla",
        {"kv_format": "fp8_per_tensor", "d_qk": 512},
        "kv_layout",
        "FP8_512_PER_TENSOR",
        "FP8_576_PER_TENSOR",
        "kv is u8 with last dim 512",
    ),
    (
        "mla_decode",
        {"kv_format": "fp8_per_tensor"},
        "kv_cache_layout",
        "FP8_576_PER_TENSOR",
        "BF16_576",
        "kv_cache is u8",
    ),
    (
        "mla_decode",
        {"kv_format": "fp8_per_tensor", "d_qk": 512},
        "kv_cache_layout",
        "FP8_512_PER_TENSOR",
        "FP8_576_PER_TENSOR",
        "kv_cache is u8 with last dim 512",
    ),
    (
        "indexer_logits_paged",
        {},
        "kv_cache_layout",
        "INDEXER_FP8_BLOCKS",
        "FLASHMLA_FP8_656",
        "not a layout kv_cache may have",
    ),
    (
        "dsa_attention",
        {"kv_format": "fp8_per_tensor", "d_qk": 512, "paged": True},
        "kv_layout",
        "FP8_512_PER_TENSOR",
        "BF16_512",
        "kv is u8",
    ),
    (
        "dsa_attention",
        {"kv_format": "fp8"},
        "kv_layout",
        "FLASHMLA_FP8_656",
        "BF16_512",
        "kv is u8",
    ),
]
IDS = [f"{op}-{right}" for op, _, _, right, _, _ in CASES]


@pytest.mark.parametrize("op,kwargs,field,right,wrong,what", CASES, ids=IDS)
def test_layout_named_unset_and_refused(client, rng, op, kwargs, field, right, wrong, what):
    case = cases.make_case(op, rng, **kwargs)
    outputs = cases.inline_outputs(case)
    for layout in (None, right, "cache_layout_" + right.lower(), cache_layout_value(right)):
        result = client.call(op, **case.arguments(**outputs), **{field: layout}, timeout=120)
        case.check(result.outputs)

    with pytest.raises(ac.AttndError) as info:
        client.call(op, **case.arguments(**outputs), **{field: wrong}, timeout=120)
    e = info.value
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT, e
    assert [v.field for v in e.field_violations] == [field], e
    assert e.details.startswith(f"{field}: is CACHE_LAYOUT_{wrong}"), e.details
    assert what in e.details, e.details

    # proto3 enums are open: a number outside the enum reaches the daemon, which refuses it.
    with pytest.raises(ac.AttndError) as info:
        client.call(op, **case.arguments(**outputs), **{field: 77}, timeout=120)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in info.value.field_violations] == [field], info.value
    assert "is 77, not a CacheLayout" in info.value.details


def _aiter_shuffle(kv_cache, block_size, dim):
    """The cache in vLLM's / AITER's SHUFFLE order (docs/INDEXER_CACHES.md): per block, each
    16-token group's codes as dim/16 tiles of 16 tokens x 16 bytes; the scales unchanged."""
    blocks = kv_cache.shape[0]
    codes = kv_cache[:, : block_size * dim].reshape(blocks, block_size // 16, 16, dim // 16, 16)
    out = kv_cache.copy()
    out[:, : block_size * dim] = codes.transpose(0, 1, 3, 2, 4).reshape(blocks, -1)
    return out


@pytest.mark.parametrize("per_token", [False, True])
def test_indexer_aiter_shuffle_cache(client, rng, per_token):
    """The same keys in the shuffled layout, named, give the blocks-layout reference; unnamed they
    are read as the blocks layout (other logits); a block size that is not a multiple of 16 is
    refused naming block_size."""
    case = cases.make_case("indexer_logits_paged", rng, per_token=per_token)
    outputs = cases.inline_outputs(case)
    block_size = case.scalars["block_size"]
    dim = case.inputs["q"].shape[-1]
    case.inputs["kv_cache"] = _aiter_shuffle(case.inputs["kv_cache"], block_size, dim)
    for layout in ("INDEXER_AITER_SHUFFLE_16", cache_layout_value("INDEXER_AITER_SHUFFLE_16")):
        result = client.call(
            "indexer_logits_paged", **case.arguments(**outputs), kv_cache_layout=layout
        )
        case.check(result.outputs)
    unnamed = client.call("indexer_logits_paged", **case.arguments(**outputs))
    with pytest.raises(AssertionError):
        case.check(unnamed.outputs)

    args = case.arguments(**outputs)
    args["block_size"] = 8
    args["kv_cache"] = args["kv_cache"].reshape(-1, 8 * (dim + 4))
    with pytest.raises(ac.AttndError) as info:
        client.call("indexer_logits_paged", **args, kv_cache_layout="INDEXER_AITER_SHUFFLE_16")
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in info.value.field_violations] == ["block_size"], info.value
    assert "want a multiple of 16" in info.value.details


# The per-tensor FP8 caches' kv_scale (docs/CONTRACTS.md "Per-tensor FP8 KV cache"): missing,
# not finite or not positive with such a cache, or set with any other cache: INVALID_ARGUMENT
# naming kv_scale.
@pytest.mark.parametrize(
    "op,kwargs",
    [
        ("sparse_mla", {}),
        ("mla_decode", {}),
        ("dsa_attention", {}),
        ("dsa_attention", {"paged": True}),
    ],
    ids=["sparse_mla", "mla_decode", "dsa_attention", "dsa_attention-paged"],
)
def test_per_tensor_kv_scale_is_checked(client, rng, op, kwargs):
    fp8 = cases.make_case(op, rng, kv_format="fp8_per_tensor", **kwargs)
    bf16 = cases.make_case(op, rng, **kwargs)
    outputs = cases.inline_outputs(fp8)
    tensor = "kv_cache" if op == "mla_decode" else "kv"
    for case, scale, says in [
        (fp8, None, "kv_scale: missing"),
        (fp8, float("nan"), "kv_scale: is nan, want finite and > 0"),
        (fp8, -0.5, "kv_scale: is -0.5, want finite and > 0"),
        (fp8, float("inf"), "kv_scale: is inf, want finite and > 0"),
        (bf16, 0.5, "kv_scale: is 0.5, but " + tensor),
    ]:
        args = case.arguments(**outputs)
        args.pop("kv_scale", None)
        if scale is not None:
            args["kv_scale"] = scale
        with pytest.raises(ac.AttndError) as info:
            client.call(op, **args, timeout=120)
        e = info.value
        assert e.code == grpc.StatusCode.INVALID_ARGUMENT, e
        assert [v.field for v in e.field_violations] == ["kv_scale"], e
        assert e.details.startswith(says), e.details


def test_unknown_layout_name_is_refused_by_the_client(client, rng):
    case = cases.make_case("mla_decode", rng)
    with pytest.raises(ValueError, match="cache layout 'BF16_575'"):
        client.mla_decode(**case.arguments(), kv_cache_layout="BF16_575")


def test_info_lists_layouts(client):
    indexer = ["INDEXER_FP8_BLOCKS", "INDEXER_AITER_SHUFFLE_16"]
    # sparse_mla and dsa_attention read the same MLA cache layouts.
    mla = ["BF16_576", "BF16_512", "FLASHMLA_FP8_656", "FP8_576_PER_TENSOR", "FP8_512_PER_TENSOR"]
    # Per op, its layout fields in order: (field, tensor, accepted).
    want = {
        "sparse_mla": [("kv_layout", "kv", mla)],
        # kv, and the paged form's index_cache.
        "dsa_attention": [
            ("kv_layout", "kv", mla),
            ("index_cache_layout", "index_cache", indexer),
        ],
        "mla_decode": [
            (
                "kv_cache_layout",
                "kv_cache",
                ["BF16_576", "BF16_512", "FP8_576_PER_TENSOR", "FP8_512_PER_TENSOR"],
            )
        ],
        "indexer_logits_paged": [("kv_cache_layout", "kv_cache", indexer)],
    }
    # Layouts that share dtype and width with an inferred one must be named: not inferred.
    named_only = {"INDEXER_AITER_SHUFFLE_16"}
    for op in client.info().ops:
        if op.name not in want:
            assert not op.cache_layouts, op
            continue
        assert len(op.cache_layouts) == len(want[op.name]), op
        for entry, (field, tensor, layouts) in zip(op.cache_layouts, want[op.name], strict=True):
            assert (entry.field, entry.tensor) == (field, tensor)
            values = [cache_layout_value(name) for name in layouts]
            assert list(entry.accepted) == values
            inferred = [cache_layout_value(name) for name in layouts if name not in named_only]
            assert list(entry.inferred) == inferred


def test_attnctl_info_prints_layouts(attnctl_bin, daemon):
    if attnctl_bin is None:
        pytest.skip("attnctl is not built (client/attnctl); set ATTNCTL_BIN")
    target = f"--target={daemon.unix_target}"
    text = subprocess.run(
        [attnctl_bin, target, "info"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    # sparse_mla and dsa_attention take the same five MLA cache layouts.
    every_kv = (
        "kv layouts (kv_layout): BF16_576*, BF16_512*, FLASHMLA_FP8_656*, FP8_576_PER_TENSOR*, "
        "FP8_512_PER_TENSOR*  ("
    )
    assert text.count(every_kv) == 2, text
    assert (
        "kv_cache layouts (kv_cache_layout): INDEXER_FP8_BLOCKS*, INDEXER_AITER_SHUFFLE_16 " in text
    ), text
    info = json.loads(
        subprocess.run(
            [attnctl_bin, target, "--json", "info"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    ops = {op["name"]: op for op in info["ops"]}
    assert ops["mla_decode"]["cache_layouts"] == [
        {
            "field": "kv_cache_layout",
            "tensor": "kv_cache",
            "accepted": ["BF16_576", "BF16_512", "FP8_576_PER_TENSOR", "FP8_512_PER_TENSOR"],
            "inferred": ["BF16_576", "BF16_512", "FP8_576_PER_TENSOR", "FP8_512_PER_TENSOR"],
        }
    ]
    assert ops["topk"]["cache_layouts"] == []
