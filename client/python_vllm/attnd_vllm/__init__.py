"""attnd_vllm: a vLLM general plugin that runs DeepSeek-V3.2's sparse attention on attnd.

vLLM loads it through the entry point `vllm.general_plugins: attnd = attnd_vllm:register`.
register() imports vLLM lazily; when vLLM is importable it registers
  1. an out-of-tree CustomOp replacing vLLM's `SparseAttnIndexer` (the lightning indexer + top-k),
  2. the attention backend `CUSTOM` (select it with --attention-backend CUSTOM): sparse MLA,
both forwarding vLLM's own tensors to attnd through attnd_client. Without vLLM it logs and
returns False. The tensor mapping lives in attnd_vllm.mapping and attnd_vllm.calls and needs
neither vLLM nor torch (docs/VLLM.md).
"""

import importlib
import logging

__version__ = "0.1.0"
__all__ = ["register", "BACKEND_CLASS_PATH", "INDEXER_OP_NAME"]

logger = logging.getLogger("attnd_vllm")

# The vLLM class the out-of-tree op replaces (CustomOp.register_oot keys on the class name), and
# the backend class registered as AttentionBackendEnum.CUSTOM.
INDEXER_OP_NAME = "SparseAttnIndexer"
BACKEND_CLASS_PATH = "attnd_vllm._vllm_glue.AttndSparseMLABackend"

_registered = False


def register() -> bool:
    """Registers attnd with vLLM (once); False, with a log line, when vLLM is not importable."""
    global _registered
    if _registered:
        return True
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        logger.info("attnd_vllm: vLLM is not importable (%s); nothing registered", e)
        return False
    importlib.import_module("attnd_vllm._vllm_glue").register_all()
    _registered = True
    logger.info(
        "attnd_vllm: registered %s (out-of-tree op) and attention backend CUSTOM (%s)",
        INDEXER_OP_NAME,
        BACKEND_CLASS_PATH,
    )
    return True
