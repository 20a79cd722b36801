"""What the tests share, imported by name (`from helpers.tiny import build_tiny`): tiny models and
drafts, checkpoint writers, the real pair's loading, the exactness comparisons and the server's
test client. tests/ is on sys.path through pyproject's [tool.pytest.ini_options] pythonpath (the
scripts that reuse these insert it themselves). The fixtures and hooks are in fixtures.py, which
tests/conftest.py loads as a plugin; no test imports it."""
