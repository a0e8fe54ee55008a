"""attnd_client: the Python client of attnd, the attention daemon (DSA and MLA operators over
gRPC). NumPy arrays in and out (bf16 as uint16, fp8 e4m3fn as uint8: see dtypes), zero-copy host
regions (POSIX shm), sessions (a lease and pipelined calls), health, info, torch tensors when
torch is importable (CUDA tensors become device regions), DLPack tensors, ml_dtypes arrays when
ml_dtypes is installed, an asyncio client (aio.AsyncClient), and stream-ordered and prepared
calls (stream_ordered: Signal, SignalWord; Client.enqueue / prepare_call / run_prepared) and
submission rings (rings.SubmissionRing: Client.open_ring / Session.open_ring), blocking calls
through one (rings.RingCaller: Client.ring_caller / Session.ring_caller) and stream-ordered calls
with the bookkeeping done (ordered.OrderedCaller: Client.ordered_caller /
Session.ordered_caller).

    import attnd_client as ac
    with ac.Client("unix:/tmp/attnd.sock") as client:
        client.wait_ready()
        res = client.topk(logits=logits, lengths=lengths, k=2048)
        print(res.indices.shape, res.stats.compute_seconds)

Install with `pip install ./client/python` (the build generates the stubs), or use it from
client/python (PYTHONPATH) with Debian's packages and the CMake target attn_python_stubs.
"""

from . import dtypes
from ._proto import pb
from .aio import AsyncClient
from .client import Client, OpFuture
from .dtypes import from_bf16, from_fp8_e4m3, to_bf16, to_fp8_e4m3
from .errors import AttndError, ErrorDetails, FieldViolation
from .ops import OPS, OpResult
from .ordered import OrderedCaller
from .regions import HostRegion, ShmObject
from .rings import RingCaller, SubmissionRing
from .session import Session, SessionCall
from .stream_ordered import FAILURE_BIT, CallFailure, Signal, SignalWord
from .tensors import Placement, RegionRef, Typed, typed

__all__ = [
    "AsyncClient",
    "AttndError",
    "CallFailure",
    "Client",
    "ErrorDetails",
    "FAILURE_BIT",
    "FieldViolation",
    "HostRegion",
    "OPS",
    "OpFuture",
    "OpResult",
    "OrderedCaller",
    "Placement",
    "RegionRef",
    "Session",
    "SessionCall",
    "Signal",
    "SignalWord",
    "RingCaller",
    "SubmissionRing",
    "ShmObject",
    "Typed",
    "dtypes",
    "from_bf16",
    "from_fp8_e4m3",
    "pb",
    "to_bf16",
    "to_fp8_e4m3",
    "typed",
]
