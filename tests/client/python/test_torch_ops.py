"""attnd_client.torch_ops (skipped without torch): the attnd::* custom ops' schemas, their fake
implementations (traced with no daemon and no binding), torch.library.opcheck, and small
nn.Modules calling them compiled with torch.compile(fullgraph=True) against a real attnd, outputs
NaN-poisoned first and checked against the fp64 reference (tests/integration: cases.py,
reference.py) within docs/ACCURACY.md's bounds. CPU tensors always; CUDA tensors (device regions,
zero copy) too when ATTND_TEST_CUDA=1, CUDA is available and ATTND_BIN is a CUDA attnd:
    ATTND_BIN=build/server/attnd PYTHONPATH=client/python \
        /work/torchvenv/bin/python -m pytest tests/client/python/test_torch_ops.py
"""

import os
import secrets
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op"):
    pytest.skip("torch < 2.4: no torch.library.custom_op", allow_module_level=True)

from attnd_client import torch_ops, torch_support  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))  # daemon.py, cases.py

import cases  # noqa: E402
from daemon import Daemon  # noqa: E402

OPS = ("mla_decode", "sparse_mla", "dsa_attention")
CUDA = os.environ.get("ATTND_TEST_CUDA") == "1" and torch.cuda.is_available()
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not CUDA, reason="CUDA tensors: set ATTND_TEST_CUDA=1 on a GPU"),
    ),
]
# The decode-path cases of tests/integration/cases.py each op runs (small shapes: H 16, d_qk 576
# or 512, contexts up to a few hundred positions). "fp8_tensor": the per-tensor FP8 cache handed
# over as a float8_e4m3fn tensor (vLLM's view of it) rather than uint8.
VARIANTS = [
    ("mla_decode", {}),
    ("mla_decode", {"precision": "high"}),
    ("mla_decode", {"kv_format": "fp8_per_tensor", "d_qk": 512, "heads": 5}),
    ("sparse_mla", {}),
    ("sparse_mla", {"form": "csr", "precision": "high"}),
    ("sparse_mla", {"form": "topk_length", "kv_format": "fp8"}),
    ("sparse_mla", {"kv_format": "fp8_per_tensor", "fp8_tensor": True}),
    ("dsa_attention", {"paged": True}),
    ("dsa_attention", {"paged": True, "kv_format": "fp8", "per_token": True, "kv_table": "page1"}),
    ("dsa_attention", {"paged": True, "kv_format": "fp8_per_tensor", "fp8_tensor": True}),
]
IDS = [op + "".join(f"-{k}={v}" for k, v in kw.items()) for op, kw in VARIANTS]
# The ops' tensor arguments in schema order (the rest of a case's arguments are scalars).
TENSOR_ARGS = {
    "mla_decode": ("q", "kv_cache", "block_table", "cache_seqlens"),
    "sparse_mla": ("q", "kv", "indices", "indptr", "topk_length"),
    "dsa_attention": (
        "index_q",
        "index_weights",
        "index_cache",
        "index_block_table",
        "context_lens",
        "q",
        "kv",
        "kv_block_table",
    ),
}


@pytest.fixture(scope="module")
def daemon():
    path = os.environ.get("ATTND_BIN") or os.path.join(ROOT, "build", "server", "attnd")
    if not os.path.exists(path):
        pytest.fail("attnd binary not found: set ATTND_BIN (ctest does)")
    d = Daemon(path, name="attnd-torch").start()
    yield d
    crashed = not d.alive()
    code = d.stop()
    log = d.log()
    d.cleanup()
    assert not crashed, f"attnd died:\n{log}"
    assert code == 0, f"attnd exited {code}:\n{log}"


@pytest.fixture(scope="module")
def client(daemon):
    c = daemon.client()
    if CUDA and c.info().backend != "cuda":
        pytest.fail("ATTND_TEST_CUDA=1 needs a CUDA attnd in ATTND_BIN")
    return c


@pytest.fixture(params=["blocking", "ordered"])
def bound(client, request):
    """The client bound both ways: CUDA tensors then run blocking, or stream-ordered on the
    current stream (bind(..., ordered=True); CPU tensors run blocking either way)."""
    previous = torch_ops.bind(client, ordered=request.param == "ordered")
    yield client
    torch_ops.synchronize(timeout=60)  # an ordered call's failure fails the test
    torch_ops.bind(previous)


@pytest.fixture
def rng():
    seed = int(os.environ.get("ATTND_TEST_SEED") or secrets.randbits(63))
    print(f"rng seed {seed}")  # shown by pytest when the test fails
    return np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield


# ---- cases as torch tensors ----


def to_torch(array, dtype, device, fp8_tensor=False):
    """A raw NumPy array of attnd dtype `dtype` as the torch tensor a model holds."""
    t = torch.from_numpy(np.ascontiguousarray(array))
    if dtype == "bf16":
        t = t.view(torch.int16).view(torch.bfloat16)
    elif dtype == "fp8_e4m3" or (dtype == "u8" and fp8_tensor):
        t = t.view(torch.float8_e4m3fn)
    return t.to(device)


POISON = {"bf16": float("nan"), "f32": float("nan"), "i32": -7}
TORCH_DTYPE = {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32}


def poisoned(case, device):
    """The case's outputs, NaN-poisoned (i32: an impossible index) so an unwritten element fails."""
    return {
        name: torch.full(shape, POISON[dtype], dtype=TORCH_DTYPE[dtype], device=device)
        for name, (dtype, shape) in case.outputs.items()
    }


def torch_case(op, rng, device, kwargs):
    """(case, input tensors by name, scalars) of a cases.py case; per-tensor FP8 caches as
    float8_e4m3fn tensors when kwargs has fp8_tensor."""
    kwargs = dict(kwargs)
    fp8_tensor = kwargs.pop("fp8_tensor", False)
    case = cases.make_case(op, rng, **kwargs)
    tensors = {
        name: to_torch(
            a, case.input_dtypes[name], device, fp8_tensor and name in ("kv", "kv_cache")
        )
        for name, a in case.inputs.items()
    }
    return case, tensors, dict(case.scalars)


def host(outputs):
    """Output tensors as the raw NumPy arrays case.check takes (bf16 as uint16 bits)."""
    return {name: torch_support.cpu_numpy(t.cpu())[0] for name, t in outputs.items()}


class Layer(torch.nn.Module):
    """A model's layer around one attnd op: q comes from a torch computation (exact: q·1 in f32,
    back to bf16), the op writes the caller's out / lse (and indices, logits), and the layer
    returns out in f32 and lse (torch work after the op, in the same graph)."""

    def __init__(self, op, scalars):
        super().__init__()
        self.op = getattr(torch.ops.attnd, op)
        self.scalars = scalars

    def forward(self, inputs, outputs):
        q = (inputs["q"].float() * 1.0).to(torch.bfloat16)
        self.op(**{**inputs, "q": q}, **outputs, **self.scalars)
        return outputs["out"].float(), outputs["lse"] + 0.0


class GraphRecorder:
    """A torch.compile backend that keeps the FX graphs it is given and runs them eagerly."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def targets(self):
        return {
            str(n.target) for g in self.graphs for n in g.graph.nodes if n.op == "call_function"
        }


# ---- schemas and binding ----


def test_schemas_are_registered():
    for op in OPS:
        schema = getattr(torch.ops.attnd, op).default._schema
        assert str(schema) == f"attnd::{op}{torch_ops.SCHEMAS[op]}"
        assert len(schema.returns) == 0
        written = {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write}
        assert written == set(torch_ops.MUTATES[op]), op
        types = {a.name: str(a.type) for a in schema.arguments}
        assert types["sm_scale"] == "float" and types["precision"] == "Optional[str]"
        assert types.get("kv_scale") == "Optional[float]"
        unsafe = getattr(torch.Tag, "cudagraph_unsafe", None)
        if unsafe is not None:
            assert unsafe in getattr(torch.ops.attnd, op).default.tags, op
    types = {a.name: str(a.type) for a in torch.ops.attnd.mla_decode.default._schema.arguments}
    assert types["causal"] == "bool" and types["kv_cache_layout"] == "Optional[str]"
    dsa = {a.name: str(a.type) for a in torch.ops.attnd.dsa_attention.default._schema.arguments}
    assert dsa["topk"] == "Optional[int]" and dsa["kv_block_stride"] == "Optional[int]"


def test_unbound_call_raises_runtime_error(rng):
    previous = torch_ops.unbind()
    try:
        case, tensors, scalars = torch_case("mla_decode", rng, "cpu", {})
        outputs = poisoned(case, "cpu")
        with pytest.raises(RuntimeError, match=r"attnd::mla_decode: no attnd client is bound"):
            torch.ops.attnd.mla_decode(**tensors, **outputs, **scalars)
        assert torch.isnan(outputs["out"].float()).all(), "nothing written"
    finally:
        torch_ops.bind(previous)


def test_bind_takes_clients_and_sessions_only(client):
    with pytest.raises(TypeError, match="Client or Session"):
        torch_ops.bind(object())
    previous = torch_ops.bind(client)
    try:
        assert torch_ops.bound() is client
        with client.session("torch-ops") as session:
            assert torch_ops.bind(session) is client
            assert torch_ops.bound() is session
    finally:
        torch_ops.bind(previous)


# ---- fake implementations: tracing touches no daemon ----


@pytest.mark.parametrize("op,kwargs", VARIANTS, ids=IDS)
def test_fake_trace_needs_no_daemon(rng, op, kwargs):
    from torch.fx.experimental.proxy_tensor import make_fx

    case, tensors, scalars = torch_case(op, rng, "cpu", kwargs)
    outputs = poisoned(case, "cpu")
    previous = torch_ops.unbind()  # a daemon call would raise
    try:
        gm = make_fx(Layer(op, scalars), tracing_mode="fake")(tensors, outputs)
    finally:
        torch_ops.bind(previous)
    called = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert getattr(torch.ops.attnd, op).default in called
    assert torch.isnan(outputs["out"].float()).all(), "tracing wrote an output"


def test_fake_checks_shapes_and_dtypes(rng):
    from torch._subclasses.fake_tensor import FakeTensorMode

    case, tensors, scalars = torch_case("mla_decode", rng, "cpu", {})
    outputs = poisoned(case, "cpu")
    with FakeTensorMode(allow_non_fake_inputs=True):
        torch.ops.attnd.mla_decode(**tensors, **outputs, **scalars)  # fine
        wrong = dict(outputs, out=torch.empty(1, 1, 16, 512, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match=r"mla_decode: out has shape \[1, 1, 16, 512\]"):
            torch.ops.attnd.mla_decode(**tensors, **wrong, **scalars)
        wide = dict(tensors, block_table=tensors["block_table"].long())
        with pytest.raises(ValueError, match="block_table is torch.int64, want int32"):
            torch.ops.attnd.mla_decode(**wide, **outputs, **scalars)
        with pytest.raises(ValueError, match="sm_scale is -1"):
            torch.ops.attnd.mla_decode(**tensors, **outputs, **dict(scalars, sm_scale=-1.0))
        with pytest.raises(ValueError, match="precision"):
            torch.ops.attnd.mla_decode(**tensors, **outputs, **dict(scalars, precision="slow"))


# ---- against the daemon ----


@pytest.mark.parametrize("op,kwargs", [VARIANTS[0], VARIANTS[3], VARIANTS[7]], ids=OPS)
def test_eager_call_writes_outputs_and_bumps_their_versions(bound, rng, op, kwargs):
    """An eager call writes its outputs in place and bumps their version counters, as torch's
    own in-place ops do (the ops are Library kernels, not custom_op's layers, which did it
    before); under inference_mode (no version counters) it runs too."""
    case, tensors, scalars = torch_case(op, rng, "cpu", kwargs)
    outputs = poisoned(case, "cpu")
    before = {name: t._version for name, t in outputs.items()}
    getattr(torch.ops.attnd, op)(**tensors, **outputs, **scalars)
    case.check(host(outputs))
    assert all(t._version > before[name] for name, t in outputs.items()), before
    with torch.inference_mode():
        outputs = poisoned(case, "cpu")
        getattr(torch.ops.attnd, op)(**tensors, **outputs, **scalars)
    case.check(host(outputs))


@pytest.mark.parametrize("op,kwargs", [VARIANTS[0], VARIANTS[3], VARIANTS[7]], ids=OPS)
def test_opcheck(bound, rng, op, kwargs):
    case, tensors, scalars = torch_case(op, rng, "cpu", kwargs)
    outputs = poisoned(case, "cpu")
    if "index_q" in tensors:  # opcheck's schema test cannot compare float8 tensors on the CPU;
        tensors["index_q"] = tensors["index_q"].view(torch.uint8)  # uint8 codes go as fp8 too
    # Positional arguments in schema order (an unset optional one as its default, None).
    schema = getattr(torch.ops.attnd, op).default._schema.arguments
    arguments = {**tensors, **outputs, **scalars}
    last = max(i for i, a in enumerate(schema) if a.name in arguments)
    args = tuple(arguments.get(a.name, a.default_value) for a in schema[: last + 1])
    torch.library.opcheck(getattr(torch.ops.attnd, op).default, args)  # runs on copies
    getattr(torch.ops.attnd, op).default(*args)
    case.check(host(outputs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("op,kwargs", VARIANTS, ids=IDS)
def test_compiled_layer_matches_reference(bound, rng, op, kwargs, backend, device):
    case, tensors, scalars = torch_case(op, rng, device, kwargs)
    outputs = poisoned(case, device)
    layer = torch.compile(Layer(op, scalars), fullgraph=True, backend=backend)
    out_f32, lse = layer(tensors, outputs)
    case.check(host(outputs))  # the caller's buffers, written by the op
    assert torch.equal(out_f32, outputs["out"].float()) and torch.equal(lse, outputs["lse"])
    # The same compiled layer again on fresh data of the same shapes (no recompilation needed).
    case, tensors, _ = torch_case(op, rng, device, dict(kwargs))
    if case.scalars == scalars:
        outputs = poisoned(case, device)
        layer(tensors, outputs)
        case.check(host(outputs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op,kwargs", [VARIANTS[0], VARIANTS[3], VARIANTS[7]], ids=OPS)
def test_inductor(bound, rng, op, kwargs, device):
    """The default backend: Inductor functionalizes the mutation and re-inplaces it."""
    case, tensors, scalars = torch_case(op, rng, device, kwargs)
    outputs = poisoned(case, device)
    layer = torch.compile(Layer(op, scalars), fullgraph=True)
    out_f32, lse = layer(tensors, outputs)
    case.check(host(outputs))
    assert torch.equal(out_f32, outputs["out"].float()) and torch.equal(lse, outputs["lse"])


@pytest.mark.parametrize("device", DEVICES)
def test_one_graph_holds_the_ops(bound, rng, device):
    """A decode step calling all three ops (and the functional form) compiles to one graph."""
    made = {
        op: torch_case(op, rng, device, kw) for op, kw in (VARIANTS[0], VARIANTS[3], VARIANTS[7])
    }
    outputs = {op: poisoned(made[op][0], device) for op in made}

    def step(inputs, outs):
        results = []
        for op in OPS:
            getattr(torch.ops.attnd, op)(**inputs[op], **outs[op], **made[op][2])
            results.append(outs[op]["out"].float().sum())
        m = inputs["mla_decode"]
        out, lse = torch_ops.mla_decode(
            m["q"], m["kv_cache"], m["block_table"], m["cache_seqlens"], **made["mla_decode"][2]
        )
        return results, out, lse

    recorder = GraphRecorder()
    compiled = torch.compile(step, fullgraph=True, backend=recorder)
    _, out, lse = compiled({op: made[op][1] for op in made}, outputs)
    assert len(recorder.graphs) == 1
    assert {f"attnd.{op}" for op in OPS} <= {t.removesuffix(".default") for t in recorder.targets()}
    for op in OPS:
        made[op][0].check(host(outputs[op]))
    made["mla_decode"][0].check(host({"out": out, "lse": lse}))


@pytest.mark.parametrize("device", DEVICES)
def test_functional_forms(bound, rng, device):
    case, t, s = torch_case("sparse_mla", rng, device, {})
    out, lse = torch.compile(torch_ops.sparse_mla, fullgraph=True, backend="aot_eager")(
        t["q"], t["kv"], t["indices"], **s
    )
    case.check(host({"out": out, "lse": lse}))
    case, t, s = torch_case("dsa_attention", rng, device, {"paged": True})
    extra = poisoned(case, device)
    out, lse = torch_ops.dsa_attention(**t, indices=extra["indices"], logits=extra["logits"], **s)
    case.check(
        host({"out": out, "lse": lse, "indices": extra["indices"], "logits": extra["logits"]})
    )


@pytest.mark.skipif(not CUDA, reason="CUDA tensors: set ATTND_TEST_CUDA=1 on a GPU")
def test_cuda_outputs_are_written_in_place(bound, rng):
    """With backend "eager" the op gets the caller's CUDA buffers themselves: the daemon writes
    them through their device regions (zero copy: no bytes copied in or out of the reply)."""
    case, tensors, scalars = torch_case("mla_decode", rng, "cuda", {})
    outputs = poisoned(case, "cuda")
    pointer = outputs["out"].data_ptr()
    layer = torch.compile(Layer("mla_decode", scalars), fullgraph=True, backend="eager")
    layer(tensors, outputs)
    assert outputs["out"].data_ptr() == pointer
    case.check(host(outputs))
    res = bound.mla_decode(**tensors, **outputs, **scalars)
    assert res.stats.copied_bytes_in == 0 and res.stats.copied_bytes_out == 0


# ---- bind(..., ordered=True): CUDA calls stream-ordered on the current stream ----


class FakeOrderedCaller:
    """Records what torch_ops hands an ordered caller."""

    def __init__(self, **options):
        self.options = options
        self.calls = []
        self.waits = []
        self.closed = False

    def call(self, op, stream=None, **arguments):
        self.calls.append((op, stream, arguments))
        return len(self.calls)

    def wait(self, n=None, timeout=None):
        self.waits.append(timeout)

    def close(self):
        self.closed = True


@pytest.mark.skipif(not CUDA, reason="CUDA tensors: set ATTND_TEST_CUDA=1 on a GPU")
def test_ordered_calls_take_the_current_streams_handle():
    """The handle an ordered op passes its caller is torch.cuda.current_stream()'s, on the
    default stream and inside `with torch.cuda.stream(side)` (read without building a Stream
    object, torch_ops._current_stream_handle)."""
    device = torch.device("cuda", torch.cuda.current_device())
    assert torch_ops._current_stream_handle(device) == torch.cuda.current_stream().cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert torch_ops._current_stream_handle(device) == side.cuda_stream
    assert side.cuda_stream != torch.cuda.current_stream().cuda_stream


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch without float8_e4m3fn")
def test_ordered_binding_views_cuda_tensors_as_their_fields(client, rng, monkeypatch):
    """A CUDA tensor whose dtype only names its field's bytes differently goes to the ordered
    caller as a view of the field's dtype (the same memory): uint8 index_q codes as
    float8_e4m3fn, a float8_e4m3fn per-tensor cache as uint8; a float8_e4m3fn index_q (its
    field's own dtype) goes as the tensor itself. Faked CUDA as in the test below; the view choice is cached per
    (dtype, field), so it is checked twice, both ways round."""
    made = []
    monkeypatch.setattr(
        client, "ordered_caller", lambda **o: made.append(FakeOrderedCaller(**o)) or made[-1],
        raising=False,
    )  # fmt: skip
    previous = torch_ops.bind(client, ordered=True)
    try:
        monkeypatch.setattr(torch_ops, "_on_cuda", lambda t: True)
        monkeypatch.setattr(
            torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 1})
        )
        op, kwargs = VARIANTS[9]  # paged, per-tensor FP8 cache as float8_e4m3fn
        case, tensors, scalars = torch_case(op, rng, "cpu", kwargs)
        outputs = poisoned(case, "cpu")
        fp8 = tensors["index_q"]
        assert fp8.dtype == torch.float8_e4m3fn and tensors["kv"].dtype == torch.float8_e4m3fn
        as_codes = dict(tensors, index_q=fp8.view(torch.uint8))
        for args in (as_codes, tensors, as_codes, tensors):
            torch.ops.attnd.dsa_attention(**args, **outputs, **scalars)
            _, _, sent = made[0].calls[-1]
            assert sent["index_q"].dtype == torch.float8_e4m3fn
            assert sent["index_q"].data_ptr() == fp8.data_ptr()
            assert (sent["index_q"] is args["index_q"]) == (args is tensors)
            assert sent["kv"].dtype == torch.uint8
            assert sent["kv"].data_ptr() == tensors["kv"].data_ptr()
            assert sent["q"] is tensors["q"] and sent["out"] is outputs["out"]
        assert len(made[0].calls) == 4
    finally:
        torch_ops.bind(previous)


def test_ordered_binding_sends_cuda_calls_to_its_caller(client, rng, monkeypatch):
    """bind(client, ordered=True, **options) makes the client's ordered caller with those
    options; an op whose tensors are all CUDA tensors (faked here: torch_ops' CUDA test and the
    current stream are patched) goes to the caller with the current stream's handle and the
    tensors themselves, not to the blocking call; CPU tensors still run blocking (checked against
    the reference); synchronize() waits on the caller; rebinding closes it; options without
    ordered=True are refused."""
    made = []

    def factory(**options):
        made.append(FakeOrderedCaller(**options))
        return made[-1]

    monkeypatch.setattr(client, "ordered_caller", factory, raising=False)
    with pytest.raises(TypeError, match="need ordered=True"):
        torch_ops.bind(client, depth=8)
    previous = torch_ops.bind(client, ordered=True, depth=8)
    try:
        fake = made[0]
        assert fake.options == {"depth": 8} and torch_ops.ordered_caller() is fake
        case, tensors, scalars = torch_case("sparse_mla", rng, "cpu", {})
        outputs = poisoned(case, "cpu")
        torch.ops.attnd.sparse_mla(**tensors, **outputs, **scalars)
        case.check(host(outputs))  # CPU tensors: the blocking call
        assert fake.calls == []
        monkeypatch.setattr(torch_ops, "_on_cuda", lambda t: True)
        monkeypatch.setattr(
            torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 0x77})
        )
        outputs = poisoned(case, "cpu")
        torch.ops.attnd.sparse_mla(**tensors, **outputs, **scalars)
        assert len(fake.calls) == 1
        op, stream, arguments = fake.calls[0]
        assert op == "sparse_mla" and stream == 0x77
        assert arguments["q"] is tensors["q"] and arguments["out"] is outputs["out"]
        assert arguments["sm_scale"] == scalars["sm_scale"]
        assert torch.isnan(outputs["out"].float()).all(), "the blocking call ran too"
        torch_ops.synchronize(timeout=5)
        assert fake.waits == [5]
    finally:
        torch_ops.bind(previous)
    assert made[0].closed and torch_ops.ordered_caller() is None
