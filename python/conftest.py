# Puts python/ on sys.path (pytest's rootdir conftest), so `pytest python/tests` works from the
# repository root without installing the package.
