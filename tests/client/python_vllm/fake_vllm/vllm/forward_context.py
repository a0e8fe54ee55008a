"""Stand-in forward context: tests set CONTEXT.attn_metadata (a dict by layer prefix)."""

from types import SimpleNamespace

CONTEXT = SimpleNamespace(attn_metadata=None)


def get_forward_context():
    return CONTEXT
