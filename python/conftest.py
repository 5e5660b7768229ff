# The tests run against the installed package (`pip install ./python`, or `maturin develop` for an
# editable one): pytest imports them with --import-mode=importlib (pyproject.toml), so python/ is
# not put on sys.path and `import tracepass` finds the installed package and its native module.
import pytest


def pytest_configure(config: pytest.Config) -> None:
    try:
        import tracepass  # noqa: F401
    except ImportError as e:
        raise pytest.UsageError(
            f"the tracepass package is not installed in this Python ({e}); "
            "install it with `pip install ./python` (from the repository root)"
        ) from e
