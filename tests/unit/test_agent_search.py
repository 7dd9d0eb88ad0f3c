"""The agent's remembered PATH search (``corral.agent.locate``), which a microVM's
agent uses: there each name missing from a directory of the guest's read-only root
is a round trip to QEMU.  Real files and real spawns; which directories count as
read-only is the one thing set by hand (a read-only mount is the guest's)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import agent


def _tool(directory: Path, name: str, says: str, mode: int = 0o755) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\necho {says}\n")
    path.chmod(mode)
    return path


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    found = {k: tmp_path / k for k in ("front", "work", "system")}
    for d in found.values():
        d.mkdir()
    fixed = {str(found["front"]), str(found["system"])}
    monkeypatch.setattr(agent, "_read_only", lambda d: d in fixed)
    monkeypatch.setattr(agent, "SEARCH_TTL", 60.0)
    monkeypatch.setenv("PATH", ":".join(str(found[k]) for k in ("front", "work", "system")))
    agent._searches.clear()
    yield found
    agent._searches.clear()


def _run(name: str) -> str:
    """What ``name`` says when the agent spawns it."""
    r, w = os.pipe()
    pid = agent.spawn([name], dict(os.environ), file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])
    os.close(w)
    with os.fdopen(r) as out:
        said = out.read().strip()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return said


def test_a_read_only_directorys_miss_is_remembered(dirs: dict[str, Path]) -> None:
    hit = _tool(dirs["system"], "hello", "system")
    assert agent.locate("hello", os.environ["PATH"]) == str(hit) and _run("hello") == "system"
    # a file appearing later in a remembered read-only miss is not looked for...
    _tool(dirs["front"], "hello", "front")
    assert agent.locate("hello", os.environ["PATH"]) == str(hit)
    # ...until the memory expires (a host-side change shows after SEARCH_TTL)
    key = (os.environ["PATH"], "hello")
    agent._searches[key] = (0.0, *agent._searches[key][1:])
    assert (
        agent.locate("hello", os.environ["PATH"]) == str(dirs["front"] / "hello")
        and _run("hello") == "front"
    )


def test_a_writable_directory_in_front_is_always_looked_in(dirs: dict[str, Path]) -> None:
    hit = _tool(dirs["system"], "hello", "system")
    assert agent.locate("hello", os.environ["PATH"]) == str(hit)
    mine = _tool(dirs["work"], "hello", "work")  # made inside the sandbox: found at once
    assert agent.locate("hello", os.environ["PATH"]) == str(mine) and _run("hello") == "work"
    mine.unlink()
    assert _run("hello") == "system"  # the remembered one is gone: searched again
    assert agent.locate("hello", os.environ["PATH"]) == str(hit)


def test_what_is_not_remembered(dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    assert (
        agent.locate("no-such-tool", os.environ["PATH"]) == "no-such-tool"
    )  # posix_spawnp's own error
    assert (
        agent.locate("./rel", os.environ["PATH"]) == "./rel"
        and agent.locate("/bin/sh", os.environ["PATH"]) == "/bin/sh"
    )
    (dirs["system"] / "adir").mkdir()
    assert agent.locate("adir", os.environ["PATH"]) == "adir"  # not a file: posix_spawnp decides
    _tool(dirs["system"], "hello", "system")
    monkeypatch.setattr(agent, "SEARCH_TTL", 0.0)  # every other tier: no memory
    assert agent.locate("hello", os.environ["PATH"]) == "hello" and not agent._searches


def test_a_file_that_will_not_run_goes_to_posix_spawnp(dirs: dict[str, Path]) -> None:
    """A remembered file that fails to run (removed, or its mode changed) is not an
    error of ours: posix_spawnp searches again, as an exec would."""
    gone = _tool(dirs["front"], "hello", "front")
    _tool(dirs["system"], "hello", "system")
    assert agent.locate("hello", os.environ["PATH"]) == str(gone)
    assert _run("hello") == "front"
    gone.chmod(0o644)  # execvp skips a file it may not run and tries the next one
    assert _run("hello") == "system"
    assert agent.locate("hello", os.environ["PATH"]) == str(
        gone
    )  # it is still the first file on PATH
    gone.unlink()
    assert _run("hello") == "system"  # the remembered file is gone: searched again
    assert agent.locate("hello", os.environ["PATH"]) == str(dirs["system"] / "hello")


def test_read_only_is_asked_of_the_nearest_existing_directory(tmp_path: Path) -> None:
    assert agent._read_only(str(tmp_path / "missing" / "deeper")) is False
    assert agent._read_only("/proc/1/nonexistent") == agent._read_only("/proc/1")


def test_the_memory_is_bounded(dirs: dict[str, Path]) -> None:
    for n in range(300):
        _tool(dirs["system"], f"t{n}", "x")
        agent.locate(f"t{n}", os.environ["PATH"])
    assert len(agent._searches) <= 257


def _run_with(path: str, name: str) -> str:
    """What ``name`` says when spawned with PATH=``path`` in its environment."""
    r, w = os.pipe()
    env = {**os.environ, "PATH": path}
    pid = agent.spawn([name], env, file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])
    os.close(w)
    with os.fdopen(r) as out:
        said = out.read().strip()
    os.waitpid(pid, 0)
    return said


def test_the_commands_own_path_is_searched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """exec(["tool"], env={"PATH": ...}) finds the tool where that PATH says, as
    subprocess or a shell would (posix_spawnp reads only the agent's own PATH);
    the twin: the agent's own PATH still finds its own."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    _tool(mine, "hello", "mine")
    _tool(theirs, "hello", "theirs")
    monkeypatch.setenv("PATH", f"{theirs}:/usr/bin:/bin")
    assert _run_with(f"{mine}:/usr/bin", "hello") == "mine"
    assert _run_with(os.environ["PATH"], "hello") == "theirs"
    # execvp's rules on that PATH: a file it may not run is passed over...
    _tool(tmp_path / "first", "hello", "first", mode=0o644)
    assert _run_with(f"{tmp_path / 'first'}:{mine}", "hello") == "mine"
    # ...and is the error only when nothing else runs; nothing at all is ENOENT
    with pytest.raises(PermissionError):
        agent.spawn(["hello"], {"PATH": str(tmp_path / "first")})
    with pytest.raises(FileNotFoundError):
        agent.spawn(["no-such-tool"], {"PATH": f"{mine}:{tmp_path / 'missing'}"})
