"""A fixture for unit tests that fake $HOME (imported where used)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture
def one_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """corral masks the account's own home (the password database's) besides $HOME:
    that is this machine's, and would be in every plan a test builds with a fake
    $HOME.  Here the fake home is the only one (the account's home is masked as
    well: tests/unit/test_policy.py and tests/integration/test_security.py)."""
    from corral import policy

    monkeypatch.setattr(policy, "home_dirs", lambda: [os.path.realpath(os.environ["HOME"])])
    yield
