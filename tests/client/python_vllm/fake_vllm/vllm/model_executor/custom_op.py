"""Stand-in CustomOp: register / register_oot keyed by name, and __new__ instantiating the
out-of-tree class registered under the class's name (how vLLM swaps an op)."""


class CustomOp:
    op_registry: dict = {}
    op_registry_oot: dict = {}
    oot_calls: list = []

    def __new__(cls, *args, **kwargs):
        chosen = CustomOp.op_registry_oot.get(cls.__name__, cls)
        return super().__new__(chosen)

    def __init__(self):
        self.initialised_by_customop = True

    @classmethod
    def register(cls, name):
        def decorator(op_cls):
            op_cls.name = name
            CustomOp.op_registry[name] = op_cls
            return op_cls

        return decorator

    @classmethod
    def register_oot(cls, _decorated_op_cls=None, name=None):
        def decorator(op_cls):
            reg_name = name if name is not None else cls.__name__
            assert reg_name not in CustomOp.op_registry_oot, f"Duplicate op name: {reg_name}"
            op_cls.name = reg_name
            CustomOp.op_registry_oot[reg_name] = op_cls
            CustomOp.oot_calls.append((reg_name, op_cls))
            return op_cls

        return decorator if _decorated_op_cls is None else decorator(_decorated_op_cls)
