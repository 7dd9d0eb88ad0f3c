"""corral shell's held-back first output (corral.shell._Held): bubblewrap's own
error becomes one corral line; the command's output, even one starting the same
way, reaches the terminal untouched."""

from __future__ import annotations

import pytest

from corral.errors import SetupError, SetupRaced
from corral.shell import _Held

RACE = b"bwrap: Can't create file at /srv/churn/s0-26.sock: Read-only file system\r\n"


def test_bwraps_setup_error_is_held_and_becomes_corrals_line(
    capfd: pytest.CaptureFixture[str],
) -> None:
    held = _Held()
    held.take(RACE[:5])  # arrives in pieces
    held.take(RACE[5:])
    assert held.holding and held.wait() is not None
    with pytest.raises(SetupRaced) as caught:  # a host path changed: plan again
        held.refuse("namespace")
    assert caught.value.message.startswith("the namespace sandbox")
    assert "bwrap" not in caught.value.message
    held.release()
    assert capfd.readouterr().out == ""  # the user's terminal never saw bwrap's words


def test_a_setup_error_that_is_no_race_is_refused_without_a_retry() -> None:
    held = _Held()
    held.take(b"bwrap: Can't mount proc on /newroot/proc: Operation not permitted\r\n")
    with pytest.raises(SetupError) as caught:
        held.refuse("namespace")
    assert not isinstance(caught.value, SetupRaced)


def test_the_commands_own_output_passes_at_once(capfd: pytest.CaptureFixture[str]) -> None:
    """The twin: a prompt is not held; nor is 'bwrap: ...' printed by the command
    itself once it has run (released by its exit code, or after PATIENCE)."""
    held = _Held()
    held.take(b"$ ")
    assert not held.holding and held.wait() is None
    held.take(b"more")
    assert capfd.readouterr().out == "$ more"
    late = _Held()
    late.take(b"bwrap: the command's own words\r\n")
    late.release()  # the exit code arrived: the command ran
    late.refuse("namespace")  # nothing held any more: nothing to refuse
    assert capfd.readouterr().out == "bwrap: the command's own words\r\n"
