"""attnd_client.aio.AsyncClient against a real daemon: readiness and health, GetInfo, every op
inline (against the fp64 reference, as test_ops does for Client), calls run concurrently with
asyncio.gather, bad requests raising AttndError, a cancelled task, and TCP."""

import asyncio

import grpc
import pytest

import attnd_client as ac

import cases
from daemon import BACKEND

OPS = ["indexer_logits", "indexer_logits_paged", "topk", "sparse_mla", "mla_decode", "mla_prefill"]


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 300))


async def connected(daemon, tcp=False):
    client = ac.aio.AsyncClient(daemon.tcp_target if tcp else daemon.unix_target)
    await client.wait_ready()
    return client


def test_ready_health_info(daemon):
    async def go():
        async with await connected(daemon) as client:
            info = await client.info()
            health = await client.health()
            watch = client.watch_health()
            first = await watch.__anext__()
            await watch.aclose()
            return info, health, first

    info, health, first = run(go())
    assert info.backend == BACKEND and info.version
    assert health == "SERVING" and first == "SERVING"


@pytest.mark.parametrize("tcp", [False, True], ids=["unix", "tcp"])
def test_every_op_concurrently(daemon, rng, tcp):
    async def go():
        async with await connected(daemon, tcp) as client:
            built = {op.name for op in (await client.info()).ops}
            made = [cases.make_case(op, rng) for op in OPS if op in built]
            calls = [
                client.call(c.op, **c.arguments(**cases.inline_outputs(c)), timeout=120)
                for c in made
            ]
            return made, await asyncio.gather(*calls)

    made, results = run(go())
    assert len(made) == len(OPS)
    for case, result in zip(made, results, strict=True):
        case.check(result.outputs)
        assert result.stats.request_id > 0 and result.stats.compute_seconds > 0


def test_typed_method_matches_the_sync_client(daemon, client, rng):
    case = cases.make_case("sparse_mla", rng)

    async def go():
        async with await connected(daemon) as aclient:
            return await aclient.sparse_mla(**case.arguments())

    result = run(go())
    case.check(result.outputs)
    sync = client.sparse_mla(**case.arguments())
    assert (result.out == sync.out).all() and (result.lse == sync.lse).all()


def test_bad_request_raises_attnd_error(daemon, rng):
    case = cases.make_case("topk", rng)
    arguments = case.arguments()
    arguments["k"] = -1

    async def go():
        async with await connected(daemon) as client:
            with pytest.raises(ac.AttndError) as error:
                await client.topk(**arguments)
            return error.value

    error = run(go())
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT, error


def test_cancelled_task_ends_the_call(daemon, rng):
    case = cases.make_case("mla_prefill", rng)

    async def go():
        async with await connected(daemon) as client:
            task = client.submit("mla_prefill", **case.arguments())
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The channel still serves calls after a cancellation.
            return await client.call("mla_prefill", **case.arguments())

    case.check(run(go()).outputs)
