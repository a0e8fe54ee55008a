"""The generated protobuf / gRPC modules of attnd.v1 (built by the CMake target attn_python_stubs
into attnd_client/_gen/). Everything else in attnd_client imports them from here:
    from attnd_client._proto import pb, pb_grpc      # pb.SparseMlaRequest, pb_grpc.AttentionStub
"""

try:
    from ._gen import attention_pb2 as pb
    from ._gen import attention_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        "attnd_client: the generated stubs are missing (attnd_client/_gen). Build them with "
        "`ninja attn_python_stubs` in the build directory (client/python/CMakeLists.txt). "
        f"Cause: {e}"
    ) from e

__all__ = ["pb", "pb_grpc"]
