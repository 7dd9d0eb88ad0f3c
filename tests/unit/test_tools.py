"""The tools a model or an MCP client calls: what a call may ask for."""

from __future__ import annotations

import pytest


def test_a_tool_calls_timeout_never_lifts_the_policys() -> None:
    """The operator's timeout bounds every command a model or an MCP client runs:
    a call's 0 or a huge value lifted it (found by attacking the MCP face), and a
    negative one shut the sandbox's channel.  Capped, or refused; the twin: a
    shorter one of the call's own is kept."""
    from types import SimpleNamespace

    from corral.tools import _call_timeout

    policy = SimpleNamespace(limits=SimpleNamespace(timeout=2.0))
    box = SimpleNamespace(sb=SimpleNamespace(policy=policy), command_timeout=None)
    for asked, got in ((0, 2.0), (10, 2.0), (None, 2.0), (1, 1.0), (0.5, 0.5)):
        assert _call_timeout(box, asked) == got, asked  # type: ignore[arg-type]
    for bad in (-31, float("nan"), 10**9, 10**400):
        with pytest.raises(ValueError):
            _call_timeout(box, bad)  # type: ignore[arg-type]
    policy.limits.timeout = None  # no operator bound: the call's own
    assert _call_timeout(box, 30) == 30.0  # type: ignore[arg-type]
