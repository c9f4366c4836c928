"""specdrill's test suite. Test modules sit under subdirectories that mirror the package they mainly test
(docs/engineering/testing.md, "Layout"), at different depths: they find the checkout and the suite's own files from
here."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent  # tests/: the helpers (tcp_forward.py, ...) and data/
REPO = TESTS.parent  # the checkout: campaigns/, docs/, serve_apps/profiles/, pyproject.toml, ...
DATA = TESTS / "data"
