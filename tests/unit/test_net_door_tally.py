"""The door's tally pipe, read by the launcher when a run ends (pure parsing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from corral.net.audit import Audit, DenyKey, describe, tally_lines, unproxied_entries, usage_lines
from corral.net.door import Door


def read(text: str) -> tuple[dict[DenyKey, int], Door]:
    door = Door.__new__(Door)  # only the reader's state; no sockets, no processes
    door.errors = 0
    door.crashes = []
    door._looked, door._asked = {}, set()
    return door._read_tally(text), door


EVIL = ("evil.test", 443, "default", "host not in the allow list", "", "")


def test_denials_from_every_worker_add_up() -> None:
    line = "deny\t" + "\t".join(map(str, EVIL))
    tally, door = read(f"{line}\t2\nerrors\t0\n{line}\t1\nerrors\t0\n")
    assert tally == {EVIL: 3}
    assert door.errors == 0 and door.crashes == []


def test_errors_and_crashes_are_counted() -> None:
    tally, door = read("errors\t2\ncrash\tproxy worker: OSError: no space (audit.py:40)\n")
    assert tally == {}
    assert door.errors == 3
    assert door.crashes == ["proxy worker: OSError: no space (audit.py:40)"]


def test_the_tally_carries_rule_reason_lookup_and_address() -> None:
    audit = Audit(None)  # counts only: no file
    entries = [
        {"host": "evil.test", "port": 443, "decision": "deny", "rule": "default", "reason": "x"},
        {"host": "evil.test", "port": 443, "decision": "deny", "rule": "default", "reason": "x"},
        {
            "host": "svc.test",
            "port": 8080,
            "decision": "deny",
            "rule": "rebinding",
            "reason": "svc.test resolved to internal address 127.0.0.1\tand\nmore",
            "address": "127.0.0.1",
        },
        {"host": "name.test", "port": 53, "scheme": "dns", "decision": "deny", "rule": "default"},
        {"host": "ok.test", "port": 443, "decision": "allow", "rule": "ok.test", "status": 200},
        {"host": "down.test", "port": 9, "decision": "allow", "rule": "down.test", "status": 502},
    ]
    for entry in entries:
        audit.record(entry)
    text = tally_lines(audit.denied)
    # one line per destination and reason; allows are not tallied, unless unreachable
    assert text.count("\n") == 4
    tally, _ = read(text)
    assert tally[("evil.test", 443, "default", "x", "", "")] == 2
    rebinding = ("svc.test", 8080, "rebinding", next(k[3] for k in tally if k[0] == "svc.test"))
    assert "\t" not in rebinding[3] and "\n" not in rebinding[3]  # a field stays one field
    assert tally[(*rebinding, "", "127.0.0.1")] == 1
    assert tally[("name.test", 53, "default", "", "dns", "")] == 1  # a lookup
    assert tally[("down.test", 9, "down.test", "", "down", "")] == 1  # allowed, not reached


def test_a_name_looked_up_that_no_worker_was_asked_for_is_told() -> None:
    """A tool that ignores the proxy variables (Node's fetch) looks the name up, then
    connects directly, and fails with nothing from corral: such a name is now
    reported, merged over the workers (one answered the lookup, another may have
    carried the request).  The twin: a name some worker was asked for is not."""
    first, second = Audit(None), Audit(None)
    for name in ("api.test", "used.test", "refused.test"):
        allow = name != "refused.test"
        first.record(
            {
                "scheme": "dns",
                "host": name,
                "port": 53,
                "method": "A",
                "decision": "allow" if allow else "deny",
                "address": "127.0.0.1,10.0.0.1" if allow else None,
            }
        )
    first.record({"scheme": "dns", "host": "empty.test", "decision": "allow", "address": None})
    second.record({"scheme": "connect", "host": "used.test", "port": 443, "decision": "allow"})
    _, door = read(usage_lines(first) + usage_lines(second))
    assert door._looked == {"api.test": "127.0.0.1", "used.test": "127.0.0.1"}
    assert door._asked == {"used.test"}
    assert unproxied_entries(door._looked, door._asked) == [
        {"host": "api.test", "address": "127.0.0.1", "unproxied": True, "count": 1}
    ]


def test_an_escaped_bad_name_stays_one_line_and_printable() -> None:
    key = ("evil.test\\x00.wild.test", 1080, "bad-name", "control character", "", "")
    tally, _ = read(tally_lines({key: 1}) + "not a line\ndeny\tshort\t1\n")
    assert tally == {key: 1}
    assert all(part.isprintable() for part in key[0])


def test_describe_is_one_line_with_the_innermost_frame() -> None:
    def inner() -> None:
        raise ValueError("two\nlines")

    try:
        inner()
    except ValueError as exc:
        text = describe("connection", exc)
    assert text.startswith("connection: ValueError: two lines (test_net_door_tally.py:")
    assert "\n" not in text


def test_waking_a_spare_that_is_gone_is_no_error() -> None:
    """A run can end between its first request and the spares' wake: the spare
    has exited, and the wake finds nobody (a silent no-op, not an audit error)."""
    import _socket

    from corral.net.door import _Spares
    from corral.netns import Listener, read_listeners

    gone, _ = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    _.close()  # gone's peer: a spare that exited
    listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    spares = _Spares.__new__(_Spares)  # no forks: only the waking
    spares.pids, spares.alive_w, spares.channels = [], -1, [gone, ours]
    spares.wake([(Listener("proxy", "127.0.0.1", 3128), listener)])  # raises nothing
    got = read_listeners(theirs)  # the live one got the listener
    assert [str(lis) for lis, _sock in got] == ["proxy 127.0.0.1:3128"]
    for _lis, sock in got:
        sock.close()
    listener.close()
    theirs.close()


def test_a_wake_after_the_run_ended_sends_nothing_and_stops_the_spares() -> None:
    """The wake is timed (SIBLINGS_AFTER); a run that ended first has closed its
    listeners.  Seen under load: sending their descriptors (-1) raised inside the
    proxy's loop, an audit error.  The spares only see their channel close."""
    import _socket

    from corral.net.door import _Spares
    from corral.netns import Listener, read_listeners

    def wake(listener: _socket.socket) -> list[tuple[Listener, _socket.socket]]:
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        spares = _Spares.__new__(_Spares)
        spares.pids, spares.alive_w, spares.channels = [], -1, [ours]
        spares.wake([(Listener("proxy", "127.0.0.1", 3128), listener)])  # raises nothing
        got = read_listeners(theirs)
        theirs.close()
        return got

    closed = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    closed.close()
    assert wake(closed) == []  # the channel ended: the spare stops unwoken
    live = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    got = wake(live)  # the twin: a live run's listener reaches the spare
    assert [str(lis) for lis, _sock in got] == ["proxy 127.0.0.1:3128"]
    for _lis, sock in got:
        sock.close()
    live.close()


def test_guarding_a_proxy_process_does_not_import_threading(tmp_path: Path) -> None:
    """The proxy's hooks cost it no `threading` import (some 4 ms per networked
    run); a finalizer's exception still becomes a counted audit line; and a
    process that has `threading` gets its hook too."""
    script = f"""
import sys
from corral.net.audit import Audit, guard_process
audit = Audit({str(tmp_path / "net.jsonl")!r})
guard_process(audit, "r1")
assert "threading" not in sys.modules
class Bad:
    def __del__(self):
        raise RuntimeError("in a finalizer")
Bad()
assert audit.errors == 1, audit.errors
import threading
guard_process(audit, "r1")
t = threading.Thread(target=lambda: 1 / 0)
t.start(); t.join()
assert audit.errors == 2, audit.errors
print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert out.stdout.strip() == "ok", out.stderr
    assert "in a finalizer" not in out.stderr and "ZeroDivisionError" not in out.stderr


def test_a_runs_audit_lines_and_tally_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command in a loop of refused requests must not fill the disk through the
    log, nor the proxy's memory through the tally: past the bounds requests are
    counted, and the log says so (once when crossing, and how many at close).
    Twin: another run's lines through the same proxy are still written."""
    from corral.net import audit as audit_mod

    monkeypatch.setattr(audit_mod, "RUN_MAX_BYTES", 2000)
    monkeypatch.setattr(audit_mod, "TALLY_MAX", 5)
    log = tmp_path / "net.jsonl"
    a = audit_mod.Audit(str(log))
    for n in range(100):
        a.record({"run_id": "loud", "host": f"h{n}.test", "port": 443, "decision": "deny"})
    a.record({"run_id": "quiet", "host": "ok.test", "port": 443, "decision": "allow"})
    a.close()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    loud = [x for x in lines if x["run_id"] == "loud"]
    assert 5 < len(loud) < 30  # some lines, then the bound
    notes = [x["reason"] for x in loud if x["decision"] == "note"]
    assert notes[0].startswith("this run's lines passed 0 MiB") and notes[1].startswith(
        f"{100 - len(loud) + 2} requests not written"
    )
    assert [x["host"] for x in lines if x["run_id"] == "quiet"] == ["ok.test"]
    assert len(a.denied) == 6 and sum(a.denied.values()) == 100
    others = [k for k in a.denied if k[0] == audit_mod.OTHERS]
    assert a.denied[others[0]] == 95
