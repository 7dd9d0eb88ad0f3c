"""corral.report: every denial of a run as data, its hint, and the lines corral prints."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from corral import report
from corral.bounds import Bound
from corral.cli import closing_lines
from corral.policy import Policy
from corral.tiers.base import Plan


def proxy_policy(tmp_path: Path, allow: list[str], deny: list[str] | None = None) -> Policy:
    pol = Policy(str(tmp_path))
    pol.network.mode = "proxy"
    pol.network.allow = allow
    pol.network.deny = deny or []
    return pol


def entry(
    host: str, port: int | None, rule: str, reason: str = "", **more: object
) -> dict[str, object]:
    return {"host": host, "port": port, "rule": rule, "reason": reason, "count": 1, **more}


def test_each_rule_gets_the_flag_that_would_allow_it_or_none(tmp_path: Path) -> None:
    pol = proxy_policy(tmp_path, ["svc.test:8080"], ["*.evil.test"])
    found = report.network(
        [
            entry("example.org", 443, "default", "host not in the allow list", count=3),
            entry("svc.test", 8080, "rebinding", "svc.test resolved to ...", address="127.0.0.1"),
            entry("::1", 9000, "default", "address not in the allow list"),
            entry("name.test", 53, "default", "host not in the allow list", lookup=True),
            entry("a.evil.test", 443, "*.evil.test", "denied by rule"),
            entry("bad\\x00name", 443, "bad-name", "control character"),
        ],
        pol,
    )
    hints = {str(d.fields["host"]): d.fields["allow_with"] for d in found}
    assert hints == {
        "example.org": "--allow example.org:443",
        "svc.test": "--allow 127.0.0.1:8080",  # the name is allowed; its address is not
        "::1": "--allow [::1]:9000",
        "name.test": "--allow name.test",  # a lookup: no port
        "a.evil.test": None,  # a deny rule said no: no flag undoes that
        "bad\\x00name": None,  # not a destination at all
    }
    assert found[0].fields["host"] == "example.org"  # most frequent first
    lookup = next(d for d in found if d.fields["host"] == "name.test")
    assert lookup.fields["port"] is None and lookup.fields["lookup"] is True
    assert all(d.kind == "network" and d.refused for d in found)


def test_the_blocked_line_names_hosts_rules_reasons_and_flags(tmp_path: Path) -> None:
    pol = proxy_policy(tmp_path, ["svc.test:8080"])
    found = report.network(
        [
            entry("example.org", 443, "default", "host not in the allow list", count=2),
            entry("svc.test", 8080, "rebinding", "svc.test resolved to 127.0.0.1", address="::1"),
        ],
        pol,
    )
    line = report.blocked_line(found, pol)
    assert line == (
        "blocked: example.org:443 (2 requests; rule default: host not in the allow list; "
        "allow with --allow example.org:443), svc.test:8080 (rule rebinding: svc.test "
        "resolved to 127.0.0.1; also allow with --allow [::1]:8080)"
    )
    assert report.blocked_line([], pol) == ""


def test_without_a_network_the_line_says_so(tmp_path: Path) -> None:
    pol = Policy(str(tmp_path))  # mode none: a refused lookup (a resolver that records)
    found = report.network([entry("example.org", 443, "no-network", "no network")], pol)
    assert report.blocked_line(found, pol) == (
        "blocked: example.org:443 (no network; allow with --allow example.org:443)"
    )


def test_each_denial_reads_as_corrals_line(tmp_path: Path) -> None:
    """``str()`` of a refused destination (a Sandbox's ``denials``) was a dict's repr:
    it is the blocked line's words for that destination alone, in the run's terms
    (found by trying corral as a new user); the twin: a lookup without a network."""
    pol = proxy_policy(tmp_path, [])
    (refused,) = report.network(
        [entry("example.org", 443, "default", "host not in the allow list")], pol
    )
    assert str(refused) == (
        "blocked: example.org:443 (rule default: host not in the allow list; "
        "allow with --allow example.org:443)"
    )
    (offline,) = report.network(
        [entry("x.test", None, "no-network", "no network", lookup=True)], Policy(str(tmp_path))
    )
    assert str(offline) == "blocked: x.test (no network; allow with --allow x.test)"
    (sneaky,) = report.network([entry("a\x1b]52;c;eA==\x07.test", 443, "default")], pol)
    assert "\x1b" not in str(sneaky)  # the sandbox's name: no terminal control survives


def test_an_allowed_destination_that_cannot_be_reached_is_its_own_line(tmp_path: Path) -> None:
    """A service allowed with nothing listening: the client saw a reset or a 502,
    so corral says it was allowed and why it failed; it is no denial, and the
    refused destination beside it keeps its own line (the twin)."""
    pol = proxy_policy(tmp_path, ["127.0.0.1:9"])
    why = "cannot connect: 127.0.0.1: Connection refused"
    found = report.network(
        [
            entry("127.0.0.1", 9, "127.0.0.1:9", why, unreachable=True, count=2),
            entry("example.org", 443, "default", "host not in the allow list"),
        ],
        pol,
    )
    down = next(d for d in found if d.kind == "unreachable")
    assert down.text == (
        "unreachable: 127.0.0.1:9 (2 connections, allowed by 127.0.0.1:9, but " + why + ")"
    )
    assert not down.refused and down.to_dict()["reason"] == why
    assert report.blocked_line(found, pol).startswith("blocked: example.org:443 (")
    assert closing_lines(found, pol, None) == [down.text, report.blocked_line(found, pol)]


def test_many_destinations_are_counted_not_listed(tmp_path: Path) -> None:
    pol = proxy_policy(tmp_path, [])
    found = report.network([entry(f"h{i}.test", 443, "default") for i in range(8)], pol)
    line = report.blocked_line(found, pol)
    assert line.count("allow with") == report.BLOCKED_SHOWN
    assert line.endswith(", and 3 more (corral run --report json lists them)")


def test_limits_hit_and_bounds_not_enforced(tmp_path: Path) -> None:
    pol = Policy(str(tmp_path))
    pol.limits.timeout = 2.0
    pol.limits.output = 10
    plan = Plan("namespace", pol)
    plan.bounds["memory"] = Bound("memory", 1 << 30, "default", False, "no cgroup delegation")
    plan.bounds["pids"] = Bound("pids", 4096, "default", True, "cgroup v1")
    found = report.limits(plan, ["memory", "timeout"], True, True, 99)
    kinds = [(d.kind, d.fields["name"]) for d in found]
    assert kinds == [
        ("limit", "memory"),
        ("limit", "timeout"),
        ("limit", "output"),
        ("bound", "memory"),
    ]
    texts = [d.text for d in found]
    assert texts[:3] == [
        "limit hit: memory",
        "timed out after 2s; killed the whole process tree",
        "output truncated: kept 10 of 99 bytes",
    ]
    assert texts[3] == ""  # said before the run, as a note
    assert found[3].fields["reason"] == "no cgroup delegation"
    assert not any(d.refused for d in found)


def test_file_denials_carry_path_rule_and_action() -> None:
    moved = report.quarantined("/ws/.vscode", moved_to="/state/q/ws/.vscode")
    failed = report.quarantined("/ws/.envrc", error="Permission denied")
    back = report.restored("/ws/.git/config", moved_to="/state/q/config")
    lost = report.restored("/ws/.git/hooks", parent="/ws/.git")
    refused = report.refused_write("/ws/.git/config", "/ws/.git/config.lock", 2)
    links = report.hardlinks(["/ws/linked"])
    assert moved.to_dict() == {
        "kind": "file",
        "path": "/ws/.vscode",
        "rule": "write-deny",
        "action": "quarantined",
        "moved_to": "/state/q/ws/.vscode",
        "error": None,
    }
    assert "could not move it: Permission denied" in failed.text
    assert back.fields["action"] == "restored" and "restored from the snapshot" in back.text
    assert lost.fields["action"] == "not restored" and "was replaced; not restored" in lost.text
    assert refused.fields == {
        "path": "/ws/.git/config",
        "rule": "write-deny",
        "action": "refused",
        "lock": "/ws/.git/config.lock",
        "count": 2,
    }
    assert "2 writes through config.lock refused" in refused.text
    assert "Device or resource busy" in refused.text
    assert links[0].fields["action"] == "read-only" and links[0].text == ""
    assert [d.refused for d in (moved, back, refused, links[0])] == [
        True,
        True,
        True,
        False,
    ]


def test_closing_lines_order_and_the_report_document(tmp_path: Path) -> None:
    pol = proxy_policy(tmp_path, [])
    net = report.network([entry("example.org", 443, "default", "x")], pol)
    moved = report.quarantined("/ws/.vscode", moved_to="/q")
    limit = report.Denial("limit", "limit hit: pids", name="pids", value=8)
    lines = closing_lines([*net, moved, limit], pol, 15)
    assert lines == [
        "limit hit: pids",
        "denied write: /ws/.vscode (write-deny) was created; moved to /q",
        "blocked: example.org:443 (rule default: x; allow with --allow example.org:443)",
        "received signal 15; killed the sandbox",
    ]
    doc = report.document("r1", "namespace", 3, [*net, moved])
    assert doc["run_id"] == "r1" and doc["exit"] == 3
    denials = cast("list[dict[str, object]]", doc["denials"])  # report.document's JSON
    assert [d["kind"] for d in denials] == ["network", "file"]


@pytest.mark.parametrize("port", [None, 0])
def test_a_destination_without_port_is_a_name(tmp_path: Path, port: int | None) -> None:
    pol = proxy_policy(tmp_path, [])
    found = report.network([entry("name.test", port, "default")], pol)
    assert found[0].fields["allow_with"] == "--allow name.test"


def test_plain_escapes_what_a_terminal_would_act_on_and_nothing_else() -> None:
    from corral.errors import plain, visible

    assert plain("/ws/notes-é ü.txt") == "/ws/notes-é ü.txt"  # printable: as it is
    assert plain("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert plain("a\nb\tc\x07") == "a\\x0ab\\x09c\\x07"  # no line of its own
    assert plain("x\x9by") == "x\\x9by"  # a C1 control (CSI)
    assert plain("abc\u202etxt.exe") == "abc\\u202etxt.exe"  # right-to-left override
    assert plain("bad\udc9b") == "bad\\udc9b"  # an undecodable byte of a file name
    assert visible("one\ntwo \x1b[31m") == "one\ntwo \\x1b[31m"  # a message's own lines stay


def test_a_denial_line_never_carries_a_terminal_control() -> None:
    d = report.quarantined("/ws/.git/hooks/x\x1b]0;owned\x07\nforged", moved_to="/q/x")
    assert "\x1b" not in d.text and "\n" not in d.text and "\x07" not in d.text
    assert d.text.startswith("denied write: /ws/.git/hooks/x\\x1b]0;owned\\x07\\x0aforged")
    assert d.to_dict()["path"] == "/ws/.git/hooks/x\x1b]0;owned\x07\nforged"  # data: exact


def test_the_approval_prompt_shows_the_request_as_plain_text() -> None:
    from corral.net.asking import AskInfo
    from corral.prompt import _what

    ask = AskInfo(
        {"id": "a1", "host": "api.test", "port": 443, "method": "DELETE", "path": "/x\x9b2K\x85"}
    )
    shown = _what(ask)
    assert shown == "DELETE api.test:443/x\\x9b2K\\x85 ()" and shown.isprintable()


def test_the_approval_prompt_hides_no_method_and_shows_the_query() -> None:
    """Five override headers: the fifth (DELETE) was cut from the screen, and the
    query the origin gets was not shown (found by attacking the proxy)."""
    from corral.net.asking import AskInfo
    from corral.prompt import _what

    also = ["OPTIONS /v1/x", "PATCH /v1/x", "PUT /v1/x", "GET /v1/x", "DELETE /v1/x"]
    ask = AskInfo(
        {
            "id": "a1",
            "host": "api.test",
            "port": 443,
            "method": "POST",
            "path": "/v1/docs/_all/_delete_by_query",
            "target": "/v1/docs%2F_all/_delete_by_query?q=*&refresh=true",
            "rule": "network.rules[1]",
            "also": also,
        }
    )
    shown = _what(ask)
    assert "/v1/docs%2F_all/_delete_by_query?q=*&refresh=true" in shown
    assert "and 1 more (DELETE; corral pending --json lists them)" in shown
    few = AskInfo({"id": "a2", "host": "api.test", "port": 443, "method": "POST",
                   "path": "/v1/x", "also": also[:4]})  # fmt: skip
    assert _what(few).endswith("also served as OPTIONS /v1/x, PATCH /v1/x, PUT /v1/x, GET /v1/x)")


def test_a_host_a_tool_goes_on_to_is_named_with_the_first(tmp_path: Path) -> None:
    """pip asks pypi.org, then files.pythonhosted.org: each was found one blocked run
    (and pip's five retries) at a time (found by trying corral as a new user); the
    twins: a companion already allowed is not named again, another host has none."""
    pol = proxy_policy(tmp_path, [])
    found = report.network(
        [entry("pypi.org", 443, "default"), entry("example.org", 443, "default")], pol
    )
    hints = {str(d.fields["host"]): d.fields["allow_with"] for d in found}
    assert hints == {
        "pypi.org": "--allow pypi.org:443 --allow files.pythonhosted.org",
        "example.org": "--allow example.org:443",
    }
    pol.network.allow = ["files.pythonhosted.org"]
    (only,) = report.network([entry("pypi.org", 443, "default")], pol)
    assert only.fields["allow_with"] == "--allow pypi.org:443"


def test_denials_by_the_thousand_are_listed_up_to_a_bound_and_counted(tmp_path: Path) -> None:
    """20,000 hard links of a secret made a 23 MB activity-log line and 20,000
    lines on stderr (found by attacking corral): each kind lists report.LISTED,
    one more counts the rest.  The twin: a few are listed, each its own line."""
    links = [report.secret_copy("/ws/.env", f"/ws/d/{i}") for i in range(20_000)]
    net = report.network(
        [entry(f"h{i}.test", 443, "not-allowed") for i in range(300)],
        proxy_policy(tmp_path, []),
    )
    kept = report.bounded(links + net)
    lines = closing_lines(kept, proxy_policy(tmp_path, []), None)
    assert len(kept) == 2 * report.LISTED + 2 and len(lines) == report.LISTED + 2
    assert lines[report.LISTED] == f"and {20_000 - report.LISTED} more like those, not listed"
    assert lines[-1].endswith(f", and {300 - report.BLOCKED_SHOWN} more (--report json lists 100)")
    assert [d.recorded()["count"] for d in kept if d.kind == "more"] == [19_900, 200]
    few = report.bounded(links[:3])
    assert few == links[:3] and len(closing_lines(few, proxy_policy(tmp_path, []), None)) == 3
