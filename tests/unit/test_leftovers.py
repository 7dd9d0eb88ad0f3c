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
