# The tests run against the installed package (`pip install ./python`, or `maturin develop` for an
# editable one): pytest imports them with --import-mode=importlib (pyproject.toml), so python/ is
# not put on sys.path and `import tracepass` finds the installed package and its native module.
import sys
from pathlib import Path

import pytest

# Tests that spawn ranks (torch.multiprocessing, start method "spawn") pickle their workers by
# module name (`tests.test_thunder_ddp._parity_worker`); the spawned interpreter finds that module
# through the sys.path it inherits. Appended, not prepended: `import tracepass` must still find
# the installed package (with its native module), not the sources in python/tracepass.
sys.path.append(str(Path(__file__).resolve().parent))


def pytest_configure(config: pytest.Config) -> None:
    try:
        import tracepass  # noqa: F401
    except ImportError as e:
        raise pytest.UsageError(
            f"the tracepass package is not installed in this Python ({e}); "
            "install it with `pip install ./python` (from the repository root)"
        ) from e
