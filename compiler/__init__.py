"""Tessel: a deep-learning compiler. The public API is kept short and loaded lazily, so that
importing one stage (say `compiler.graph`) does not pull in every later one."""

_LAZY = {
    "build": ("compiler.build", "build"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'compiler' has no attribute {name!r}")


__all__ = list(_LAZY)
