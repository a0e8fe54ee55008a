"""Stand-in attention backend registry: an enum with CUSTOM and register_backend overrides."""

import enum


class AttentionBackendEnum(enum.Enum):
    FLASHMLA_SPARSE = "vllm.v1.attention.backends.mla.flashmla_sparse.FlashMLASparseBackend"
    CUSTOM = None


OVERRIDES: dict = {}


def register_backend(backend, class_path=None, is_mamba=False):
    if class_path is not None:
        OVERRIDES[backend] = class_path
        return lambda x: x

    def decorator(cls):
        OVERRIDES[backend] = f"{cls.__module__}.{cls.__qualname__}"
        return cls

    return decorator
