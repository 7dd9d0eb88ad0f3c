"""corral.container.leftovers' pure parts: finding a stuck container's processes
by the ID its conmon names, and the runtime's state directory."""

from __future__ import annotations

from corral.container import leftovers

ID = "f704f05b48914b245e1c6f96d06ea4a82d6fce58a6223e066e765fb4691ee9ea"
OTHER = "0" * 64
ARGVS = {
    10: ["/usr/bin/conmon", "--api-version", "1", "-c", ID, "-u", ID, "-n", "corral-abc"],
    11: ["/usr/bin/runsc", "--log", f"/run/containers/{ID}/userdata/oci-log", "create", ID],
    12: ["runsc-gofer", "--root=/var/run/runsc", f"--log=/run/{ID}/oci-log", "gofer"],
    20: ["/usr/bin/conmon", "-c", OTHER, "-n", "corral-other"],
    21: ["runsc-sandbox", "--root=/var/run/runsc", f"--log=/run/{OTHER}/oci-log"],
    30: ["sleep", "1000"],
}


def test_the_container_is_found_by_its_name_and_its_processes_by_its_id() -> None:
    ids = leftovers.container_ids("corral-abc", ARGVS)
    assert ids == {ID}
    assert leftovers.holders(ids, ARGVS) == [10, 11, 12]  # not the other container's
    assert leftovers.runtime_roots([10, 11, 12], ARGVS) == {"/var/run/runsc"}


def test_nothing_is_found_for_a_name_no_conmon_gives() -> None:
    """Twin: an unknown name matches no process (not even by substring)."""
    ids = leftovers.container_ids("corral-ab", ARGVS)
    assert ids == set() and leftovers.holders(ids, ARGVS) == []


def test_a_process_that_only_calls_itself_conmon_chooses_nothing() -> None:
    """Found by attacking the container tier: any process whose argv[0] was conmon
    and that named the run's container (in the engine's argv, for all to see)
    chose the ID, and with it every process killed (by substring: -c / matched
    all) and the --root whose entries were removed, as root.  Only conmon's own
    program with an ID of the engine's form counts, a process carries an ID only
    as an argument, an option's value or a path component, and a root must be an
    absolute path; the twin: the real conmon's container is found as before."""
    fake = {
        40: ["conmon", "-n", "corral-abc", "-c", "/"],
        41: ["conmon", "-n", "corral-abc", "-c", OTHER, "--root=/etc"],
        42: ["sh", "-c", "sleep 120", "x" + ID + "y"],
    }
    argvs = {**ARGVS, **fake}
    exes = {10: "conmon", 20: "conmon", 40: "python3.11", 41: "python3.11"}
    assert leftovers.container_ids("corral-abc", argvs, exes) == {ID}
    assert leftovers.holders({ID}, argvs) == [10, 11, 12]  # not 42: a substring only
    assert leftovers.container_ids("corral-abc", {40: fake[40]}, None) == set()  # "/": no ID
    assert leftovers.runtime_roots([1], {1: ["runsc", "--root=../x", "--root=rel"]}) == set()
