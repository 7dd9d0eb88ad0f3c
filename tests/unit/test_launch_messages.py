"""corral's words for a command that cannot start and for bwrap's setup failures (pure)."""

from __future__ import annotations

import pytest

from corral.failures import cannot_run, execvp_failure, setup_failure


def test_cannot_run_says_what_is_missing_and_where_it_looked() -> None:
    assert cannot_run("foo", True, "", "/usr/bin:/bin", None) == (
        "corral: foo: command not found in the sandbox (PATH=/usr/bin:/bin)"
    )
    assert cannot_run("foo", True, "", "/nope", None, by_policy=True) == (
        "corral: foo: command not found in the sandbox (PATH=/nope, set by the policy)"
    )
    assert cannot_run("./x", True, "", "", False) == "corral: ./x: no such file in the sandbox"
    assert "#! line names is not in the sandbox" in cannot_run("./x", True, "", "", True)
    assert "(or its #! interpreter is missing)" in cannot_run("./x", True, "", "", None)
    assert cannot_run("/etc/passwd", False, "Permission denied", "", None) == (
        "corral: cannot run /etc/passwd: Permission denied"
    )


@pytest.mark.parametrize(
    ("line", "expected", "code"),
    [
        (
            "bwrap: execvp foo: No such file or directory",
            "corral: foo: command not found in the sandbox (PATH=/bin)",
            127,
        ),
        (
            "bwrap: execvp /w/a: b: Permission denied",  # a colon in the name
            "corral: cannot run /w/a: b: Permission denied",
            126,
        ),
    ],
)
def test_bwrap_execvp_in_corral_words(line: str, expected: str, code: int) -> None:
    assert execvp_failure(line, "/bin") == (expected, code)


def test_other_lines_are_not_execvp() -> None:
    assert execvp_failure("bwrap: Can't chdir to /x: No such file", "/bin") is None
    assert execvp_failure("something else", "/bin") is None


@pytest.mark.parametrize(
    ("lines", "fragment"),
    [
        (
            ["bwrap: Can't chdir to /ws/private: Permission denied"],
            "cannot enter the working directory /ws/private inside the sandbox: Permission denied",
        ),
        (
            ["bwrap: Can't find source path /home/u/.cache/x: No such file or directory"],
            "/home/u/.cache/x went away while the sandbox was set up (No such file or directory)",
        ),
        (
            ["bwrap: Creating new namespace failed: Operation not permitted"],
            "user namespaces are not available here (Operation not permitted); see corral doctor",
        ),
        (
            ["bwrap: No permissions to creating new namespace, likely because ..."],
            "user namespaces are not available here",
        ),
        (
            [
                "bwrap: Can't bind mount /oldroot/ on /newroot/: Unable to apply mount flags: "
                'remount "/newroot/var/lib/containers/x/merged": No such file or directory'
            ],
            "a host mount changed during setup (Unable to apply mount flags: remount",
        ),
        (["bwrap: Unknown thing happened"], "could not be set up: bwrap: Unknown thing happened"),
        ([], "could not be set up: bwrap: no reason given"),
    ],
)
def test_setup_failures_in_one_corral_line(lines: list[str], fragment: str) -> None:
    said = setup_failure("namespace", lines)
    assert said.startswith("the namespace sandbox could not be set up: ")
    assert fragment in said and "\n" not in said


def test_a_host_path_that_changed_during_setup_is_a_race_others_are_not() -> None:
    from corral.failures import raced

    assert raced(["bwrap: Can't create file at /srv/x.sock: Read-only file system"])
    assert raced(["bwrap: Can't find source path /srv/x.sock: No such file or directory"])
    assert raced(["bwrap: Can't mkdir parents for /srv/a/b: Permission denied"])
    assert raced(
        [
            "bwrap: Can't bind mount /oldroot/ on /newroot/: Unable to apply mount flags: "
            'remount "/newroot/var/lib/containers/storage/overlay/b4/merged": Invalid argument'
        ]
    )
    # twins: failures planning again cannot fix
    assert not raced(["bwrap: Creating new namespace failed: Operation not permitted"])
    assert not raced(["bwrap: execvp nosuch: No such file or directory"])
    assert not raced([])


def test_planning_again_keeps_the_hosts_socket_list(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """After a setup race corral may be inside the sandbox's network namespace,
    where /proc/net/unix lists none of the host's sockets: the list read for the
    first plan is kept (a mask must never be lost by planning again)."""
    from corral import fsplan

    monkeypatch.setattr(fsplan, "_seen_sockets", None)
    monkeypatch.setattr(fsplan, "_frozen_sockets", None)
    head = "Num RefCount Protocol Flags Type St Inode Path\n"
    host = tmp_path / "host"
    host.write_text(head + "0: 00000002 00000000 00010000 0001 01 1 /srv/api.sock\n")
    inside = tmp_path / "inside"
    inside.write_text(head)
    assert fsplan.host_unix_sockets(str(host)) == ["/srv/api.sock"]
    assert fsplan.host_unix_sockets(str(inside)) == []  # twin: unfrozen, read afresh
    fsplan.host_unix_sockets(str(host))
    fsplan.freeze_host_sockets()
    assert fsplan.host_unix_sockets(str(inside)) == ["/srv/api.sock"]
