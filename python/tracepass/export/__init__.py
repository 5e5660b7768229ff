"""tracepass.export: trace PyTorch models with Lightning Thunder into tracepass export directories.

`export` and `ExportError` load torch on first use, so `tracepass.export.vocab` runs without it.
"""

__all__ = ["ExportError", "export"]


def __getattr__(name):
    if name in __all__:
        from . import exporter

        return getattr(exporter, name)
    raise AttributeError(f"module 'tracepass.export' has no attribute {name!r}")
