"""Run by test_venv.py with the Python of a fresh virtual environment into which
`pip install ./client/python[ml-dtypes]` installed attnd_client: checks that the installed
package (not the source tree) is the one imported, with its generated stubs and grpc_health.v1,
and drives the daemon at argv[1] with the sync and the asyncio client, ml_dtypes arrays and a
DLPack input, against the fp64 reference. Prints "venv client ok" at the end.
    <venv>/bin/python tests/integration/venv_client.py unix:/tmp/.../attnd.sock
"""

import asyncio
import os
import secrets
import sys

import ml_dtypes
import numpy as np

import attnd_client as ac
from attnd_client import health

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # cases, reference

import cases  # noqa: E402 (after the path it lives in)


class DlpackOnly:
    """A DLPack producer that is not a NumPy array."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, *args, **kwargs):
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def main(target):
    prefix = os.path.realpath(sys.prefix)
    assert os.path.realpath(ac.__file__).startswith(prefix), (ac.__file__, prefix)
    assert health.SOURCE == "grpc_health.v1", health.SOURCE
    seed = secrets.randbits(63)
    print(f"rng seed {seed}")
    rng = np.random.default_rng(seed)

    with ac.Client(target) as client:
        client.wait_ready()
        assert client.health() == "SERVING"
        # sparse_mla with ml_dtypes inputs; out comes back as ml_dtypes.bfloat16.
        case = cases.make_case("sparse_mla", rng)
        arguments = case.arguments()
        arguments["q"] = arguments["q"].view(ml_dtypes.bfloat16)
        arguments["kv"] = arguments["kv"].view(ml_dtypes.bfloat16)
        result = client.sparse_mla(**arguments)
        assert result.out.dtype == ml_dtypes.bfloat16, result.out.dtype
        case.check(result.outputs)
        # topk with its logits and lengths through DLPack.
        case = cases.make_case("topk", rng)
        arguments = case.arguments(**cases.inline_outputs(case))
        arguments["logits"] = DlpackOnly(arguments["logits"])
        arguments["lengths"] = DlpackOnly(arguments["lengths"])
        case.check(client.topk(**arguments).outputs)
        # Error details (docs/SERVICE.md "Status codes"), parsed here by the google.rpc classes
        # of googleapis-common-protos, a dependency of the package.
        from attnd_client import errors

        assert errors._GOOGLEAPIS
        try:
            client.unregister_region("venv-no-such-region")
            raise AssertionError("unregistering an unknown region succeeded")
        except ac.AttndError as e:
            assert (e.resource_type, e.resource_name) == ("attnd.v1.Region", "venv-no-such-region")

    async def aio_calls():
        async with ac.aio.AsyncClient(target) as aclient:
            await aclient.wait_ready()
            made = [cases.make_case(op, rng) for op in ("mla_decode", "indexer_logits")]
            results = await asyncio.gather(
                *(aclient.call(c.op, **c.arguments(**cases.inline_outputs(c))) for c in made)
            )
            for c, r in zip(made, results, strict=True):
                c.check(r.outputs)
            bad = cases.make_case("sparse_mla", rng)
            arguments = bad.arguments()
            arguments["q"] = arguments["q"][:, :, :575]
            try:
                await aclient.call("sparse_mla", **arguments)
                raise AssertionError("q with d_qk 575 was accepted")
            except ac.AttndError as e:
                assert [v.field for v in e.field_violations] == ["q.shape[2]"], e

    asyncio.run(aio_calls())
    print("venv client ok")


if __name__ == "__main__":
    main(sys.argv[1])
