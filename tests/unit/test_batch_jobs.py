"""corral.batch's pure parts: job lines, the corral run argv, resume, retries."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from corral import batch, cli, placement
from corral.usage import help_text


def test_job_command_as_list_or_shell_string() -> None:
    assert batch.check_job({"id": "a", "command": ["pytest", "-q"]}, 1)["argv"] == ["pytest", "-q"]
    job = batch.check_job({"command": "echo hi | wc"}, 7)
    assert job["argv"] == ["/bin/sh", "-c", "echo hi | wc"] and job["id"] == "line7"


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({"command": ["x"], "colour": "red"}, "line 3: unknown key 'colour'"),
        ({"command": []}, "line 3: command must be"),
        ({"command": ["x"], "env": "HOME"}, "line 3: env must be a list of strings"),
        (["x"], "line 3: a job is a JSON object"),
    ],
)
def test_bad_jobs_name_what_is_wrong(raw: object, error: str) -> None:
    with pytest.raises(batch.JobError, match=error):
        batch.check_job(raw, 3)


def test_read_jobs_reports_bad_lines_and_runs_the_rest(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    lines = [
        '{"id": "a", "command": ["true"], "workspace": "ws"}',
        "{oops",
        "",
        '{"id": "a", "command": ["true"]}',
        '{"id": "b", "command": "x", "typo": 1}',
    ]
    jobs.write_text("\n".join(lines) + "\n")
    got = list(batch.read_jobs(str(jobs)))
    assert got[0]["workspace"] == str(tmp_path / "ws")  # relative to the jobs file
    assert got[1] == {
        "id": "line2",
        "exit": None,
        "attempts": 0,
        "line": 2,
        "error": "line 2: not JSON: Expecting property name enclosed in double quotes",
    }
    assert got[2]["error"] == "line 4: id 'a' used twice"
    assert got[3]["id"] == "b" and got[3]["error"].startswith("line 5: unknown key 'typo'")


def test_corral_argv_is_a_normal_corral_run() -> None:
    job = batch.check_job(
        {
            "command": ["make"],
            "policy": "p.toml",
            "timeout": "10m",
            "memory": "1G",
            "env": ["CI"],
            "workspace": "/w",
        },
        1,
    )
    argv = batch.corral_argv(job, "/r", "/l", "/n")
    head = argv[: argv.index("run") + 1]
    assert head in (
        [sys.executable, "-P", "-m", "corral", "run"],
        [f"{sys.prefix}/bin/corral", "run"],
    )
    tail = argv[len(head) :]
    assert tail[tail.index("--policy") + 1] == "p.toml"
    assert tail[tail.index("--timeout") + 1] == "10m" and tail[tail.index("--env") + 1] == "CI"
    assert tail[-2:] == ["--", "make"] and tail[tail.index("--report") + 1] == "/r"


def test_each_jobs_policy_is_pinned_when_the_batch_begins(tmp_path: Path) -> None:
    import hashlib

    named, found, bare = (tmp_path / d for d in ("named", "found", "bare"))
    for d in (named, found, bare):
        d.mkdir()
    (named / "p.toml").write_text("[limits]\ntimeout = 30\n")
    (found / "corral.toml").write_text("[limits]\npids = 77\n")
    jobs = [
        batch.check_job({"command": ["x"], "policy": "p.toml", "workspace": str(named)}, 1),
        batch.check_job({"command": ["x"], "workspace": str(found)}, 2),
        batch.check_job({"command": ["x"], "workspace": str(bare)}, 3),
        batch.check_job({"command": ["x"], "policy": "gone.toml", "workspace": str(bare)}, 4),
    ]
    one, two, three, four = batch.pin_policies(jobs)
    assert one["policy"] == str(named / "p.toml")  # relative: to the workspace
    sha = hashlib.sha256(b"[limits]\ntimeout = 30\n").hexdigest()
    assert batch.run_flags(one)[-2:] == ["--policy-sha256", sha]
    assert two["policy"] == str(found / "corral.toml")  # found now, not by the node later
    assert three["policy"] == os.devnull  # none then: the defaults, whatever appears
    assert three[batch.PINNED] == hashlib.sha256(b"").hexdigest()
    assert four["error"] == "policy: No such file or directory" and four["line"] == 4


def test_a_pinned_policy_that_changed_is_refused(tmp_path: Path) -> None:
    import hashlib

    from corral import policy as pol
    from corral.errors import PolicyError

    path = tmp_path / "p.toml"
    path.write_text("[limits]\npids = 77\n")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert pol.load(str(tmp_path), str(path), sha256=sha).limits.pids == 77  # the twin
    path.write_text('tier = "none"\n')
    with pytest.raises(PolicyError, match="changed since it was pinned"):
        pol.load(str(tmp_path), str(path), sha256=sha)


def test_finished_ids_drops_a_line_cut_short(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    out.write_text(
        json.dumps({"id": "a", "exit": 0})
        + "\n"
        + json.dumps({"id": "b", "exit": 1})
        + '\n{"id": "c", "ex'
    )
    assert batch.finished_ids(str(out)) == {"a": True, "b": False}
    assert out.read_text().count("\n") == 2 and out.read_text().endswith("}\n")
    assert batch.finished_ids(str(tmp_path / "none")) == {}


def test_retries_only_when_the_machine_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake(job: batch.Job, output_bytes: int) -> batch.Result:
        calls.append(job["id"])
        if job["id"] == "flaky" and len(calls) < 3:
            return {"id": "flaky", "exit": 125, "error": "setup", "machine_failed": True}
        return {"id": job["id"], "exit": 1 if job["id"] == "fails" else 0, "machine_failed": False}

    monkeypatch.setattr(batch, "run_job", fake)
    jobs = [{"id": "flaky", "command": ["x"]}, {"id": "fails", "command": ["x"]}]
    got = {r["id"]: r for r in batch.run(jobs, concurrency=1)}
    assert got["flaky"]["attempts"] == 3 and got["flaky"]["exit"] == 0
    assert got["fails"]["attempts"] == 1 and got["fails"]["exit"] == 1  # a failed command: once
    assert calls.count("fails") == 1
    calls.clear()
    got = {r["id"]: r for r in batch.run(jobs, retries=0, skip={"fails"})}
    assert list(got) == ["flaky"] and got["flaky"]["exit"] == 125


def test_missing_ray_is_one_line_and_122(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if not installed
    jobs = tmp_path / "j.jsonl"
    jobs.write_text('{"command": ["true"]}\n')
    code = cli.main(["batch", str(jobs), "--out", str(tmp_path / "r"), "--ray", "auto"])
    err = capsys.readouterr().err
    assert code == 122 and err.count("\n") == 1 and "pip install 'corral[ray]'" in err


def test_batch_help_from_the_option_table() -> None:
    text = help_text("batch")
    assert "--out FILE" in text and "--ray ADDRESS" in text and "-j, --jobs N" in text
    assert "122  --ray" in text and "corral batch JOBS.jsonl" in text


def test_placements_are_not_tiers() -> None:
    from corral import tiers

    assert not set(placement.names()) & set(tiers.names())
    local = placement.get("local")
    assert local.health()[0]
    ours, theirs = local.channel()
    ours.sendall(b"x")
    assert theirs.recv(1) == b"x"
    ours.close()
    theirs.close()
    with pytest.raises(ValueError, match="unknown placement"):
        placement.get("moon")


def test_copy_in_reads_no_source_through_a_link_a_job_could_make(tmp_path: Path) -> None:
    """A job running meanwhile swapped a files source (or a directory on its way, in
    its workspace) for a link to a secret, and the next job got a copy: refused,
    nothing copied; the twins: a plain source, and one below an operator's link
    outside every job's workspace, are copied."""
    secret, ws, dest = tmp_path / "secret", tmp_path / "ws", tmp_path / "dest"
    secret.write_text("key\n")
    (ws / "real").mkdir(parents=True)
    dest.mkdir()
    (ws / "plain.txt").write_text("plain\n")
    (ws / "real" / "f.txt").write_text("f\n")
    (ws / "link.txt").symlink_to(secret)
    (ws / "sub").symlink_to(ws / "real")
    (tmp_path / "opdir").symlink_to(ws / "real")  # the operator's, outside the workspaces
    places = [str(ws) + "/"]

    def copy(src: Path) -> None:
        into = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
        try:
            batch._copy_one(str(src), src.name, into, places)
        finally:
            os.close(into)

    for bad in (ws / "link.txt", ws / "sub" / "f.txt"):
        with pytest.raises(OSError, match="symlink"):
            copy(bad)
    assert not (dest / "link.txt").exists()
    copy(ws / "plain.txt")
    copy(tmp_path / "opdir" / "f.txt")
    assert (dest / "plain.txt").read_text() == "plain\n" and (dest / "f.txt").read_text() == "f\n"
