"""Every operator through a real daemon, driven by the Python client: inline, zero-copy through
host regions (outputs poisoned first), pipelined on a Session, over TCP; each against the fp64
NumPy reference (reference.py). Strided layouts, clean_logits=false and bad requests too."""

import grpc
import numpy as np
import pytest

import attnd_client as ac

import cases
from daemon import wait_until

ALL_OPS = list(cases.MAKERS)
VARIANTS = [
    ("indexer_logits", {}),
    ("indexer_logits", {"precision": "fast"}),
    ("indexer_logits", {"precision": "high"}),
    ("indexer_logits_paged", {}),
    ("topk", {}),
    ("topk", {"fused": True}),
    ("topk", {"row_start": True}),
    ("topk", {"row_start": True, "fused": True}),
    ("topk", {"row_start": True, "fused": True, "request_map": "req_ids"}),
    ("topk", {"fused": True, "request_map": "cu"}),
    ("indexer_logits_paged", {"per_token": True}),
    ("indexer_logits_paged", {"precision": "fast"}),
    ("indexer_logits_paged", {"per_token": True, "precision": "high"}),
    ("sparse_mla", {}),
    ("sparse_mla", {"form": "csr"}),
    ("sparse_mla", {"form": "topk_length"}),
    ("sparse_mla", {"d_qk": 512}),
    ("sparse_mla", {"kv_format": "fp8"}),
    ("sparse_mla", {"kv_format": "fp8_per_tensor"}),
    ("sparse_mla", {"kv_format": "fp8_per_tensor", "d_qk": 512, "form": "csr"}),
    ("mla_decode", {}),
    ("mla_decode", {"d_qk": 512, "heads": 5}),
    ("mla_decode", {"kv_format": "fp8_per_tensor"}),
    ("mla_decode", {"kv_format": "fp8_per_tensor", "d_qk": 512, "heads": 5}),
    ("mla_prefill", {}),
    ("dsa_attention", {}),
    ("dsa_attention", {"kv_format": "fp8"}),
    ("dsa_attention", {"paged": True}),
    ("dsa_attention", {"paged": True, "kv_format": "fp8", "per_token": True, "kv_table": "page1"}),
    ("dsa_attention", {"paged": True, "next_n": 1, "precision": "high"}),
    ("dsa_attention", {"kv_format": "fp8_per_tensor"}),
    ("dsa_attention", {"kv_format": "fp8_per_tensor", "d_qk": 512}),
    ("dsa_attention", {"paged": True, "kv_format": "fp8_per_tensor"}),
    ("dsa_attention", {"paged": True, "kv_format": "fp8_per_tensor", "d_qk": 512, "next_n": 1}),
    ("sparse_mla", {"precision": "high"}),
    ("sparse_mla", {"kv_format": "fp8", "precision": "fast"}),
    ("mla_decode", {"precision": "high"}),
    ("mla_prefill", {"precision": "high"}),
    ("dsa_attention", {"precision": "high"}),
    ("dsa_attention", {"index_precision": "fast"}),
    ("dsa_attention", {"paged": True, "index_precision": "fast"}),
    ("dsa_attention", {"paged": True, "next_n": 1, "index_precision": "high", "precision": "high"}),
]
# The ops with a `precision` option and what it defaults to (docs/ACCURACY.md).
PRECISION_DEFAULTS = {
    "indexer_logits": "high",
    "indexer_logits_paged": "high",
    "sparse_mla": "fast",
    "mla_decode": "fast",
    "mla_prefill": "fast",
    "dsa_attention": "fast",
}
IDS = [op + "".join(f"-{k}={v}" for k, v in kw.items()) for op, kw in VARIANTS]


@pytest.fixture(scope="module")
def built_ops(client):
    return {op.name for op in client.info().ops}


def need(op, built_ops):
    if op not in built_ops:
        pytest.skip(f"{op} is not built into this attnd (absent from GetInfo)")


def test_info_describes_ops_and_limits(client, built_ops):
    info = client.info()
    assert info.backend in ("cpu", "cuda", "hip") and info.version
    assert built_ops <= set(ALL_OPS), built_ops
    assert {"indexer_logits", "topk", "sparse_mla", "mla_decode", "mla_prefill"} <= built_ops
    for op in info.ops:
        assert op.rpc == ac.OPS[op.name].rpc and list(op.implementations), op
        precisions = op.name in PRECISION_DEFAULTS
        want = [ac.pb.PRECISION_FAST, ac.pb.PRECISION_HIGH] if precisions else []
        assert list(op.precisions) == want, op
    assert info.limits.allow_client_shm and info.limits.device_handle_bytes == 64
    assert info.devices and info.devices[0].cores >= 1


@pytest.mark.parametrize("op,kwargs", VARIANTS, ids=IDS)
def test_inline(client, built_ops, rng, op, kwargs):
    need(op, built_ops)
    case = cases.make_case(op, rng, **kwargs)
    result = client.call(op, **case.arguments(**cases.inline_outputs(case)), timeout=120)
    case.check(result.outputs)
    inline_in = sum(a.nbytes for a in case.inputs.values())
    assert result.stats.copied_bytes_in == inline_in
    assert result.stats.copied_bytes_out > 0 and result.stats.impl
    assert result.stats.compute_seconds > 0 and result.stats.request_id > 0
    # The precision that ran: the one asked for, else the op's default; none for the other ops.
    assert result.precision == kwargs.get("precision", PRECISION_DEFAULTS.get(op))
    # dsa_attention's indexer step: high unless fast is asked for; none for the other ops.
    default_index = "high" if op == "dsa_attention" else None
    assert result.index_precision == kwargs.get("index_precision", default_index)


@pytest.mark.parametrize("op,kwargs", VARIANTS, ids=IDS)
def test_region(client, built_ops, rng, op, kwargs):
    need(op, built_ops)
    case = cases.make_case(op, rng, **kwargs)
    with client.create_host_region(f"ops-{op}", cases.region_bytes(case)) as region:
        cases.run_in_region(client, region, case)


def test_session_pipelines_every_op(client, built_ops, rng):
    todo = [cases.make_case(op, rng, **kw) for op, kw in VARIANTS if op in built_ops]
    with client.session("test_ops") as session:
        calls = [session.submit(c.op, **c.arguments(**cases.inline_outputs(c))) for c in todo]
        ids = {call.request_id for call in calls}
        assert len(ids) == len(calls)
        for case, call in zip(todo, calls, strict=True):
            case.check(call.result(timeout=120).outputs)
        # Region calls on the same stream, regions under the session's lease.
        case = cases.make_case("sparse_mla", rng)
        region = session.create_host_region("ops-session", cases.region_bytes(case))
        listed = {r.name: r for r in client.list_regions()}
        assert listed["ops-session"].lease_id == session.lease_id
        cases.run_in_region(session, region, case)
    # The lease ends as the daemon finishes the stream (just after the client sees it end).
    wait_until(
        lambda: "ops-session" not in {r.name for r in client.list_regions()},
        timeout=10,
        what="the session's region to go",
    )


def test_tcp_inline(daemon, rng):
    tcp = daemon.client(tcp=True)
    case = cases.make_case("mla_decode", rng)
    case.check(tcp.call("mla_decode", **case.arguments()).outputs)


def test_strided_region_input_and_output(client, rng):
    """kv as a strided view (row stride 640 > 576) and logits with ld = N + 13, in a region."""
    case = cases.make_case("sparse_mla", rng, rows=200)
    with client.create_host_region("ops-strided", 4 << 20) as region:
        kv_rows = region.array("bf16", (200, 640))
        kv_rows[:, :576] = case.inputs["kv"]
        kv_rows[:, 576:] = 0x7FC0  # NaN padding that must never be read
        args = case.arguments()
        args["kv"] = kv_rows[:, :576]
        out, lse = region.array("bf16", (8, 16, 512)), region.array("f32", (8, 16))
        client.sparse_mla(**args, out=out, lse=lse)
        case.check({"out": out, "lse": lse})

        il = cases.make_case("indexer_logits", rng)
        m, n = il.outputs["logits"][1]
        padded = region.array("f32", (m, n + 13))
        padded[...] = -123.0
        client.indexer_logits(**il.arguments(), logits=padded[:, :n])
        il.check({"logits": padded[:, :n]})
        assert (padded[:, n:] == -123.0).all(), "columns [N, ld) were touched"
    # The same row stride inline (Placement with strides).
    res = client.indexer_logits(
        **il.arguments(), logits=ac.Placement(shape=(m, n), strides=(n + 13, 1))
    )
    assert res.logits.strides == ((n + 13) * 4, 4)
    il.check({"logits": res.logits})


def test_lse_in_callers_layout(client, rng):
    """lse written straight into vLLM's [H, T] buffer (a [T, H] view with strides (1, ld), ld =
    T + 3) in a region, the poisoned gaps untouched; inline, the reply keeps those strides
    (docs/CONTRACTS.md "Strided lse")."""
    case = cases.make_case("sparse_mla", rng)
    t, h = case.outputs["lse"][1]
    ld = t + 3
    poison = np.array([0x7FC0BEEF], dtype=np.uint32).view(np.float32)[0]
    with client.create_host_region("ops-lse-layout", 4 << 20) as region:
        out = region.array("bf16", (t, h, 512))
        lse_ht = region.array("f32", (h, ld), offset=1 << 20)
        lse_ht.view(np.uint32)[...] = 0x7FC0BEEF
        lse = region.ref("f32", (t, h), offset=1 << 20, strides=(1, ld))
        client.sparse_mla(**case.arguments(), out=out, lse=lse)
        case.check({"out": out, "lse": lse_ht[:, :t].T})
        gaps = lse_ht[:, t:].view(np.uint32)
        assert (gaps == poison.view(np.uint32)).all(), "elements between the rows were written"
        # The same buffer as a plain NumPy view (its transpose): the client describes the strides.
        lse_ht.view(np.uint32)[...] = 0x7FC0BEEF
        client.sparse_mla(**case.arguments(), out=out, lse=lse_ht[:, :t].T)
        case.check({"out": out, "lse": lse_ht[:, :t].T})
        assert (gaps == poison.view(np.uint32)).all(), "elements between the rows were written"
        # A tensor that needs a contiguous last dimension is refused by the daemon, naming it.
        with pytest.raises(ac.AttndError) as info:
            wide = region.array("bf16", (t, h, 1024), offset=2 << 20)
            client.sparse_mla(**case.arguments(), out=wide[:, :, ::2], lse=lse)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "out" in info.value.details
    res = client.sparse_mla(**case.arguments(), lse=ac.Placement(shape=(t, h), strides=(1, ld)))
    assert res.lse.strides == (4, ld * 4)
    case.check({"out": res.out, "lse": res.lse})


def test_clean_logits_false_leaves_columns(client, rng):
    case = cases.make_case("indexer_logits", rng)
    m, n = case.outputs["logits"][1]
    with client.create_host_region("ops-unclean", 4 << 20) as region:
        args = {k: region.put(v, case.input_dtypes[k]) for k, v in case.inputs.items()}
        logits = region.array("f32", (m, n))
        logits[...] = rng.standard_normal((m, n)).astype(np.float32)
        before = logits.copy()
        client.indexer_logits(**args, clean_logits=False, logits=logits)
        import reference

        want = reference.indexer_logits(
            case.inputs["q"],
            case.inputs["k"],
            case.inputs["k_scale"],
            case.inputs["weights"],
            case.inputs["ks"],
            case.inputs["ke"],
            clean_logits=False,
            logits=before,
        )
        reference.assert_f32_close("logits", logits, want)


def test_output_copied_into_given_array(client, rng):
    case = cases.make_case("topk", rng)
    indices = np.full(case.outputs["indices"][1], -5, dtype=np.int32)
    res = client.topk(**case.arguments(), indices=indices, values=True)
    assert res.indices is indices
    case.check({"indices": indices, "values": res.values})


def test_bad_requests_name_the_tensor(client, rng):
    case = cases.make_case("sparse_mla", rng)
    args = case.arguments()
    args["q"] = args["q"][:, :, :575]
    with pytest.raises(ac.AttndError) as e:
        client.call("sparse_mla", **args)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "q" in e.value.details
    args = case.arguments()
    args["indices"] = ac.RegionRef("no-such-region", "i32", (8, 70))
    with pytest.raises(ac.AttndError) as e:
        client.call("sparse_mla", **args)
    assert e.value.code == grpc.StatusCode.NOT_FOUND and "indices" in e.value.details
