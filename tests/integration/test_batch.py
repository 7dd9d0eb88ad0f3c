"""corral batch on this machine: each job a real corral run (bwrap, door, proxy),
results keyed by id, bad lines reported with their number, resume."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from conftest import Corral
from test_network import CURL, HTTP_PROXY, Origin, origins  # noqa: F401  (fixture)


def _write_jobs(c: Corral, ws: Path, jobs: list[object]) -> Path:
    path = ws / "jobs.jsonl"
    path.write_text("".join((j if isinstance(j, str) else json.dumps(j)) + "\n" for j in jobs))
    c.chown(path)
    return path


def _results(path: Path) -> dict[str, dict[str, Any]]:  # JSON lines, by job id
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def _batch(c: Corral, ws: Path, jobs: Path, out: Path, *flags: str) -> tuple[int, str]:
    r = c.run(["batch", str(jobs), "--out", str(out), *flags], cwd=ws.parent, timeout=120)
    return r.returncode, r.stderr.decode()


def test_batch_runs_each_job_in_its_own_sandbox(
    sandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811  (the fixture imported above)
) -> None:
    c, ws = sandbox
    ok, bad = origins
    policy = ws.parent / "net.toml"
    policy.write_text(f'[network]\nmode = "proxy"\nallow = ["127.0.0.1:{ok.port}"]\n')
    c.chown(policy)
    outside = ws.parent / "outside.txt"
    jobs = _write_jobs(
        c,
        ws,
        [
            {"id": "list", "command": ["sh", "-c", "echo listed"], "workspace": str(ws)},
            {"id": "fails", "command": "echo partial; exit 3", "workspace": str(ws)},
            "{not json",
            {"id": "typo", "command": ["true"], "colour": "red"},
            # the same policy denies a write outside the workspace and allows its twin
            {
                "id": "write-in",
                "command": "echo in > in.txt",
                "workspace": str(ws),
                "artifacts": ["in.txt"],
            },
            {"id": "write-out", "command": f"echo out > {outside}", "workspace": str(ws)},
            {
                "id": "net",
                "workspace": str(ws),
                "policy": str(policy),
                "command": f"{CURL} {HTTP_PROXY} http://127.0.0.1:{ok.port}/yes; "
                f"{CURL} {HTTP_PROXY} -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{bad.port}/no",
            },
        ],
    )
    out = ws / "results.jsonl"
    code, err = _batch(c, ws, jobs, out, "-j", "2")
    assert code == 1, err  # some jobs failed
    # each bad line on stderr with its number, then one line that says how many failed
    lines = err.splitlines()
    assert any(x.startswith("corral: ") and ": line 3: not JSON" in x for x in lines), err
    assert any(": line 4: unknown key 'colour'" in x for x in lines), err
    assert lines[-1].startswith("corral batch: ") and "did not succeed; see " in lines[-1], err
    res = _results(out)
    assert res["list"]["exit"] == 0 and res["list"]["output"] == "listed\n"
    assert res["fails"]["exit"] == 3 and res["fails"]["attempts"] == 1  # never retried
    assert res["line3"]["error"].startswith("line 3: not JSON")
    assert res["typo"]["error"].startswith("line 4: unknown key 'colour'")
    assert res["write-in"]["exit"] == 0
    assert res["write-in"]["artifacts"] == [{"path": "in.txt", "bytes": 3}]
    assert (ws / "in.txt").read_text() == "in\n"
    assert res["write-out"]["exit"] != 0 and not outside.exists()
    assert "hello from origin" in res["net"]["output"] and "\n403" in res["net"]["output"]
    assert ok.hits == [("GET", "/yes")] and bad.hits == []
    assert any(d.get("kind") == "network" for d in res["net"]["denials"]), res["net"]
    assert all(isinstance(r.get("duration", 0.0), float) for r in res.values())
    # every job's run record lands in the caller's activity log, tagged with its id
    runs = [json.loads(x) for x in (c.state / "corral" / "runs.jsonl").read_text().splitlines()]
    assert {r.get("batch_id") for r in runs} >= {"list", "fails", "net", "write-in"}


def test_batch_resumes_and_bounds_output(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    jobs = _write_jobs(
        c,
        ws,
        [
            {
                "id": f"j{i}",
                "command": f"echo j{i} >> ran.txt; printf '%0100d' 0",
                "workspace": str(ws),
            }
            for i in range(4)
        ],
    )
    out = ws / "results.jsonl"
    # a first batch finished j0 and was killed while writing j1's line
    out.write_text(json.dumps({"id": "j0", "exit": 0}) + '\n{"id": "j1", "ex')
    c.chown(out)
    code, err = _batch(c, ws, jobs, out, "--output-bytes", "10")
    assert code == 0 and err == ""  # no terminal: no progress bar, nothing said
    assert sorted((ws / "ran.txt").read_text().split()) == ["j1", "j2", "j3"]
    res = _results(out)
    assert sorted(res) == ["j0", "j1", "j2", "j3"]
    assert res["j2"]["output"] == "0" * 10 and res["j2"]["output_truncated"] is True
    # the same command again: nothing left to run, nothing counted twice
    code, err = _batch(c, ws, jobs, out)
    assert code == 0, err
    assert len(out.read_text().splitlines()) == 4
    assert len((ws / "ran.txt").read_text().split()) == 3


def test_batch_one_line_errors(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    r = c.run(["batch", "nope.jsonl"], cwd=ws)
    assert r.returncode == 2 and r.stderr.decode().count("\n") == 1
    assert b"--out is required" in r.stderr
    r = c.run(["batch", "nope.jsonl", "--out", "r.jsonl"], cwd=ws)
    assert r.returncode == 2 and b"cannot read nope.jsonl" in r.stderr
    jobs = _write_jobs(c, ws, [{"id": "a", "command": ["true"]}])
    r = c.run(["batch", str(jobs), "--out", "r.jsonl", "--ray", "127.0.0.1:9"], cwd=ws)
    assert r.returncode == 122 and r.stderr.decode().count("\n") == 1, r.stderr
    # this user's Python may lack ray: then the fix is to install it
    assert b"cannot reach the Ray cluster at 127.0.0.1:9" in r.stderr or b"pip install" in r.stderr


def test_doctor_lists_placements_apart_from_tiers(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    r = c.run(["doctor", "--json"], cwd=ws)
    doc = json.loads(r.stdout)
    names = [p["name"] for p in doc["placements"]]
    assert names == ["local", "ray", "kubernetes"] and doc["placements"][0]["available"]
    assert not set(names) & {t["name"] for t in doc["tiers"]}
    text = c.run(["doctor"], cwd=ws).stdout.decode()
    assert "placements (where a sandbox runs" in text and "\n  local " in text


def test_batch_reuse_runs_jobs_in_warm_sandboxes_each_as_if_alone(
    sandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811  (the fixture imported above)
) -> None:
    """--reuse: one warm sandbox for jobs with the same options, reset after each;
    the policy holds for every job (deny and allow twins), a job's leftovers never
    reach the next, and each job's network refusals are in its own result."""
    c, ws = sandbox
    ok, bad = origins
    policy = ws.parent / "net.toml"
    policy.write_text(f'[network]\nmode = "proxy"\nallow = ["127.0.0.1:{ok.port}"]\n')
    c.chown(policy)
    outside = ws.parent / "outside.txt"
    common = {"workspace": str(ws), "policy": str(policy)}
    jobs = _write_jobs(
        c,
        ws,
        [
            {
                "id": "leave",
                **common,
                "command": "setsid sleep 300 >/dev/null 2>&1 & "
                "echo x > /tmp/left; echo in > in.txt; echo left",
            },
            {
                "id": "after",
                **common,
                "command": "ps -e -o comm | grep -c '^sleep'; "
                "ls -A /tmp /dev/shm | grep -c left; cat in.txt",
            },
            {"id": "write-out", **common, "command": f"echo out > {outside}"},
            {"id": "plant", **common, "command": "mkdir -p .vscode && echo x > .vscode/tasks.json"},
            {"id": "planted", **common, "command": "ls -A .vscode 2>&1 || echo none"},
            {
                "id": "net",
                **common,
                "command": f"{CURL} {HTTP_PROXY} http://127.0.0.1:{ok.port}/yes; "
                f"{CURL} {HTTP_PROXY} -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{bad.port}/no",
            },
            {"id": "quiet", **common, "command": "echo fine; echo err >&2; echo after"},
        ],
    )
    out = ws / "results.jsonl"
    code, err = _batch(c, ws, jobs, out, "-j", "1", "--reuse")
    assert code == 1, err  # write-out failed
    res = _results(out)
    assert res["leave"]["exit"] == 0 and res["leave"]["output"] == "left\n"
    assert res["after"]["output"] == "0\n0\nin\n", res["after"]  # killed, emptied; workspace kept
    assert res["write-out"]["exit"] != 0 and not outside.exists()
    # a write-deny path the job created is quarantined after it, as after a run:
    # the next job in the same sandbox does not find it
    assert any(d.get("action") == "quarantined" for d in res["plant"]["denials"]), res["plant"]
    assert "none" in res["planted"]["output"] and not (ws / ".vscode").exists()
    assert "hello from origin" in res["net"]["output"] and "\n403" in res["net"]["output"]
    assert ok.hits == [("GET", "/yes")] and bad.hits == []
    refused = [d for d in res["net"]["denials"] if d.get("kind") == "network"]
    assert refused and all(d.get("port") == bad.port for d in refused), res["net"]
    assert res["quiet"]["denials"] == []
    assert res["quiet"]["output"] == "fine\nerr\nafter\n"  # one stream, in order
    runs = [json.loads(x) for x in (c.state / "corral" / "runs.jsonl").read_text().splitlines()]
    mine = {r["batch_id"]: r for r in runs if r.get("reused")}
    assert set(mine) == set(res) and len({r["run_id"] for r in mine.values()}) == 1
    net = [json.loads(x) for x in (c.state / "corral" / "net.jsonl").read_text().splitlines()]
    assert [x["batch_id"] for x in net if x.get("decision") == "deny"] == ["net"]


def test_a_job_cannot_reach_outside_through_copy_in_or_rewrite_the_batch(
    sandbox: tuple[Corral, Path],
) -> None:
    """Found by attacking the faces from outside, both as root and as a user:
    - a job left ``input.txt`` a symlink to a host file, and the next job's
      ``files`` were copied through it (the host file overwritten, its mode
      changed; as root, any file); an artifact's size was the host file's;
    - a job (its workspace is the jobs file's directory) appended a job with a
      policy it wrote (tier = "none"), and the resumed batch ran it unconfined.
    Copy-in opens the name without following a link and refuses one that is
    not a plain file of one link; the jobs file, the results file and the jobs'
    policies are read-only to the jobs.  The twins: a plain copy-in lands, and
    the jobs write their workspace."""
    c, ws = sandbox
    victim = ws.parent / "victim.txt"
    victim.write_text("precious\n")
    os.chmod(victim, 0o600)
    inputs = ws / "inputs"
    inputs.mkdir()
    (inputs / "input.txt").write_text("job data\n")
    (inputs / "fresh.txt").write_text("fresh data\n")
    policy = ws / "build.toml"
    policy.write_text("[limits]\ntimeout = 30\n")
    c.chown(ws)
    appended = json.dumps({"id": "later", "command": "id", "policy": "evil.toml"})
    jobs = _write_jobs(
        c,
        ws,
        [
            {"id": "plant", "command": f"ln -s {victim} input.txt", "artifacts": ["input.txt"]},
            {"id": "copy", "command": "cat input.txt", "files": ["inputs/input.txt"]},
            {  # a later job's source swapped for a link to a host file
                "id": "swap",
                "command": f"rm -f inputs/fresh.txt; ln -s {victim} inputs/fresh.txt",
            },
            {"id": "fresh", "command": "cat fresh.txt", "files": ["inputs/fresh.txt"]},
            {
                "id": "rewrite",
                "command": f"echo '{appended}' >> jobs.jsonl; echo x >> build.toml; "
                "echo '[sandbox]' > evil.toml; echo mine > mine.txt",
                "policy": "build.toml",
            },
        ],
    )
    before = jobs.read_text()
    out = ws / "results.jsonl"
    _batch(c, ws, jobs, out, "-j", "1")  # (in order: the link, then the copy)
    results = _results(out)
    assert victim.read_text() == "precious\n" and (victim.stat().st_mode & 0o777) == 0o600
    assert results["plant"]["artifacts"] == [{"path": "input.txt", "bytes": None}]
    assert "'input.txt' is a symlink" in results["copy"]["error"], results["copy"]
    assert results["fresh"]["exit"] == 0 and results["fresh"]["output"] == "fresh data\n"
    assert jobs.read_text() == before and policy.read_text() == "[limits]\ntimeout = 30\n"
    assert (ws / "mine.txt").read_text() == "mine\n"
    _batch(c, ws, jobs, out, "-j", "1")  # resumed: nothing new to run
    assert "later" not in _results(out)


def test_a_jobs_policy_is_the_one_read_when_the_batch_began(
    sandbox: tuple[Corral, Path], tmp_path_factory: Any
) -> None:
    """Found by attacking batches: a job allowed to write a shared directory rewrote
    another job's policy there (tier = "none"), and that job ran unconfined; a
    job planted a corral.toml in a workspace whose job named no policy, and on
    another Ray node that job loaded it.  Each job's policy is now read once,
    when the batch begins (its workspace's corral.toml, or none), and a job runs
    only if the file still holds that.  The twins: an untouched policy runs, and
    a job whose workspace had no corral.toml runs under the defaults."""
    c, ws = sandbox
    shared = ws.parent / "shared"  # outside the writer's workspace, writable by its policy
    shared.mkdir()
    (shared / "x.toml").write_text("[limits]\ntimeout = 30\n")
    (shared / "y.toml").write_text("[limits]\ntimeout = 30\n")
    (ws / "writer.toml").write_text(f'[filesystem]\nwritable = ["{shared}"]\n')
    other = ws / "other"  # a workspace of its own, with no corral.toml at the start
    other.mkdir()
    c.chown(ws)
    c.chown(shared)
    outside = ws.parent / "ESCAPED"
    evil = f'tier = \\"none\\"\\n[filesystem]\\nwritable = [\\"{ws.parent}\\"]\\n'
    jobs = _write_jobs(
        c,
        ws,
        [
            {
                "id": "writer",
                "command": f'printf "{evil}" > {shared}/x.toml; '
                f'printf "{evil}" > other/corral.toml',
                "policy": "writer.toml",
            },
            {"id": "x", "command": f"touch {outside}", "policy": str(shared / "x.toml")},
            {"id": "y", "command": "echo fine", "policy": str(shared / "y.toml")},
            {"id": "planted", "command": f"touch {outside}; echo ran", "workspace": "other"},
        ],
    )
    out = ws / "results.jsonl"
    _batch(c, ws, jobs, out, "-j", "1")
    results = _results(out)
    assert results["writer"]["exit"] == 0, results["writer"]
    assert "tier" in (shared / "x.toml").read_text()  # the rewrite happened
    assert results["x"]["exit"] != 0 and "changed since it was pinned" in results["x"]["output"]
    assert results["y"]["exit"] == 0 and results["y"]["output"] == "fine\n"
    assert not outside.exists()
    # ran under the defaults it had when the batch began (no corral.toml then):
    # its write outside the workspace refused, the run itself fine
    # (stdout and stderr come through two pipes: how their lines interleave varies)
    planted = results["planted"]
    assert planted["exit"] == 0 and "ran\n" in planted["output"], planted
    assert "Read-only file system" in planted["output"], planted
