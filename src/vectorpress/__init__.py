__version__ = "0.1.0"

__all__ = ["AsyncEngine", "Engine", "__version__"]


def __getattr__(name: str) -> object:
    # Lazy: `import vectorpress` (the CLI's version flag) must not import torch.
    if name in ("Engine", "AsyncEngine"):
        from vectorpress import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'vectorpress' has no attribute {name!r}")
