"""The two ways corral makes the system calls Python 3.11's ``os`` lacks, as a
fixture the unit tests of each caller run under (``usefixtures("syscalls")``)."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(params=["corral._sys", "ctypes"])
def syscalls(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Its own C module, and, as on an install built without a C compiler,
    ctypes' C module (and the socket module for the network calls)."""
    if request.param == "ctypes":
        monkeypatch.setitem(sys.modules, "corral._sys", None)  # import raises ImportError
    else:
        pytest.importorskip("corral._sys", reason="corral._sys was not built (no C compiler)")
    return str(request.param)
