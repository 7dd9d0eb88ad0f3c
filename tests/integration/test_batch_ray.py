"""corral batch --ray on a real Ray cluster on loopback: a head (no CPUs, so jobs
land on the workers) and two worker nodes, each a ``ray start`` of its own.

Runs as the user the tests run as (the cluster is that user's); the jobs'
sandboxes are built on the node that runs them by that node's corral.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from test_network import CURL, HTTP_PROXY, Origin

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.raycluster import Cluster, ray_missing

pytestmark = pytest.mark.skipif(ray_missing() is not None, reason=str(ray_missing()))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(workers=2)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A directory the sandboxes see as the host's (pytest's own is under /tmp,
    which the namespace tier replaces with a private tmpfs)."""
    root = Path("/var/lib/corral-tests") if os.geteuid() == 0 else Path.home()
    root.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="batch-ray-", dir=root))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _batch(
    cluster: Cluster, tmp: Path, jobs: Sequence[Mapping[str, object]], *flags: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, dict[str, Any]]]:
    path, out = tmp / "jobs.jsonl", tmp / "results.jsonl"
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "corral",
            "batch",
            str(path),
            "--out",
            str(out),
            "--ray",
            cluster.address,
            "--log",
            str(tmp / "runs.jsonl"),
            "--net-log",
            str(tmp / "net.jsonl"),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=cluster.env,
    )
    results: dict[str, dict[str, Any]] = {}
    if out.exists():
        for line in out.read_text().splitlines():
            res = json.loads(line)
            assert res["id"] not in results, f"{res['id']} counted twice"
            results[res["id"]] = res
    return r, results


@pytest.mark.slow  # (a three-node cluster starts in a minute here: the default run's largest cost)
def test_ray_smoke_jobs_spread_over_the_workers(cluster: Cluster, tmp_path: Path) -> None:
    """The default run's one Ray test: sandboxed jobs on two worker nodes."""
    ws = tmp_path / "ws"
    ws.mkdir()
    jobs = [
        {"id": f"s{i}", "command": f"sleep 1; echo {i} > f{i}; cat f{i}", "workspace": str(ws)}
        for i in range(4)
    ]
    r, res = _batch(cluster, tmp_path, jobs)
    assert r.returncode == 0, r.stderr
    assert sorted(res) == ["s0", "s1", "s2", "s3"]
    assert all(res[f"s{i}"]["output"] == f"{i}\n" for i in range(4))
    assert len({x["node"] for x in res.values()}) == 2  # both workers ran jobs


@pytest.mark.slow
def test_ray_reuse_warm_sandboxes_on_each_node_hold_the_policy(
    cluster: Cluster, tmp_path: Path
) -> None:
    """--reuse on Ray: an actor per CPU keeps warm sandboxes on its node, reset
    after each job; every job still meets the policy (deny and allow twins) and
    its records and audit lines reach the caller's one log."""
    ok, bad = Origin(), Origin()
    try:
        ws = tmp_path / "ws"
        ws.mkdir()
        policy = tmp_path / "net.toml"
        policy.write_text(f'[network]\nmode = "proxy"\nallow = ["127.0.0.1:{ok.port}"]\n')
        outside = tmp_path / "outside.txt"
        jobs = [
            {
                "id": f"w{i}",
                "workspace": str(ws),
                "policy": str(policy),
                "command": f"sleep 0.5; ls /tmp | grep -c mark; touch /tmp/mark; "
                f"echo in > in{i}.txt && echo wrote-in; "
                f"echo out > {outside} || echo refused-out; "
                f"{CURL} {HTTP_PROXY} http://127.0.0.1:{ok.port}/w{i}; "
                f"{CURL} {HTTP_PROXY} -o /dev/null -w '%{{http_code}}\\n' "
                f"http://127.0.0.1:{bad.port}/w{i}",
            }
            for i in range(6)
        ]
        r, res = _batch(cluster, tmp_path, jobs, "--reuse")
        assert r.returncode == 0, (r.stderr, res)
        assert len({x["node"] for x in res.values()}) == 2  # both workers' actors
        for i in range(6):
            out = res[f"w{i}"]["output"]
            assert out.startswith("0\n"), out  # the job before it left no /tmp/mark
            assert "wrote-in" in out and "refused-out" in out, out
            assert "hello from origin" in out and "\n403\n" in out, out
            assert [d["port"] for d in res[f"w{i}"]["denials"]] == [bad.port]
        assert not outside.exists()
        assert sorted(p for _, p in ok.hits) == [f"/w{i}" for i in range(6)] and bad.hits == []
        runs = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
        assert sorted(r["batch_id"] for r in runs) == [f"w{i}" for i in range(6)]
        assert all(r["reused"] for r in runs)
        assert len({r["run_id"] for r in runs}) == 2  # one warm sandbox per actor
        net = [json.loads(x) for x in (tmp_path / "net.jsonl").read_text().splitlines()]
        denied = sorted(x["batch_id"] for x in net if x.get("decision") == "deny")
        assert denied == [f"w{i}" for i in range(6)]
    finally:
        ok.close()
        bad.close()


@pytest.mark.slow
def test_ray_each_node_enforces_the_same_policy(cluster: Cluster, tmp_path: Path) -> None:
    ok, bad = Origin(), Origin()
    try:
        ws = tmp_path / "ws"
        ws.mkdir()
        policy = tmp_path / "net.toml"
        policy.write_text(f'[network]\nmode = "proxy"\nallow = ["127.0.0.1:{ok.port}"]\n')
        outside = tmp_path / "outside.txt"
        jobs = []
        for i in range(4):  # two per worker at one CPU each, the sleep spreads them
            jobs.append(
                {
                    "id": f"n{i}",
                    "workspace": str(ws),
                    "policy": str(policy),
                    "command": f"sleep 1; echo in > in{i}.txt && echo wrote-in; "
                    f"echo out > {outside} || echo refused-out; "
                    f"{CURL} {HTTP_PROXY} http://127.0.0.1:{ok.port}/n{i}; "
                    f"{CURL} {HTTP_PROXY} -o /dev/null -w '%{{http_code}}\\n' "
                    f"http://127.0.0.1:{bad.port}/n{i}",
                }
            )
        r, res = _batch(cluster, tmp_path, jobs)
        assert r.returncode == 0, (r.stderr, res)
        assert len({x["node"] for x in res.values()}) == 2
        for i in range(4):
            out = res[f"n{i}"]["output"]
            assert "wrote-in" in out and "refused-out" in out, out  # the write twins
            assert "hello from origin" in out and "\n403\n" in out, out  # the network twins
            assert (ws / f"in{i}.txt").exists()
        assert not outside.exists()
        assert sorted(p for _, p in ok.hits) == [f"/n{i}" for i in range(4)] and bad.hits == []
        # one log on the caller's side: every node's run records and audit lines
        runs = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
        assert sorted(r["batch_id"] for r in runs) == [f"n{i}" for i in range(4)]
        assert {r["node"] for r in runs} == {x["node"] for x in res.values()}
        net = [json.loads(x) for x in (tmp_path / "net.jsonl").read_text().splitlines()]
        denied = [x for x in net if x.get("decision") == "deny"]
        assert sorted(x["batch_id"] for x in denied) == [f"n{i}" for i in range(4)]
        assert all(x["port"] == bad.port for x in denied)
    finally:
        ok.close()
        bad.close()


@pytest.mark.slow
def test_ray_resume_skips_finished_jobs(cluster: Cluster, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    jobs = [
        {"id": f"r{i}", "command": f"echo r{i} >> ran.txt", "workspace": str(ws)} for i in range(3)
    ]
    (tmp_path / "results.jsonl").write_text(json.dumps({"id": "r0", "exit": 0}) + "\n")
    r, res = _batch(cluster, tmp_path, jobs)
    assert r.returncode == 0, r.stderr
    assert sorted(res) == ["r0", "r1", "r2"]
    assert sorted((ws / "ran.txt").read_text().split()) == ["r1", "r2"]


@pytest.mark.slow
def test_ray_refused_policy_says_the_nodes_reason(cluster: Cluster, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    policy = tmp_path / "p.toml"
    policy.write_text('tier = "seatbelt"\n')  # no Linux node can honour it
    r, res = _batch(
        cluster,
        tmp_path,
        [
            {"id": "mac", "command": ["true"], "workspace": str(ws), "policy": str(policy)},
            {"id": "fine", "command": ["true"], "workspace": str(ws)},
        ],
    )
    assert r.returncode == 1
    assert res["fine"]["exit"] == 0
    assert res["mac"]["exit"] == 122 and res["mac"]["attempts"] == 1
    assert str(res["mac"]["error"]).startswith("refused on node ")
    assert "seatbelt" in str(res["mac"]["error"])


@pytest.mark.slow
@pytest.mark.parametrize("flags", [(), ("--reuse",)], ids=["cold", "reuse"])
def test_ray_worker_killed_mid_batch_jobs_retried_elsewhere(
    cluster: Cluster, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    jobs = [
        {"id": f"k{i}", "command": f"sleep 4; echo k{i} >> done.txt", "workspace": str(ws)}
        for i in range(4)
    ]
    # kill worker1 while its first job sleeps
    killer = threading.Timer(2.5, cluster.kill, args=("worker1",))
    killer.start()
    try:
        r, res = _batch(cluster, tmp_path, jobs, *flags)
    finally:
        killer.join()
        cluster.add_worker(f"worker{3 + len(flags)}")  # back to two workers for later tests
    assert r.returncode == 0, (r.stderr, res)
    assert sorted(res) == [f"k{i}" for i in range(4)]  # nothing lost, nothing twice
    assert all(x["exit"] == 0 for x in res.values())
    retried = [x for x in res.values() if x["attempts"] > 1]
    assert retried, res  # the killed node's job ran again on another node
    assert sorted(set((ws / "done.txt").read_text().split())) == [f"k{i}" for i in range(4)]
