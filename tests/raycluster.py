"""A real Ray cluster on loopback for tests and the benchmark: a head and worker
nodes, each ``ray start --block`` in a session of its own, so stopping (or
killing) one node is signalling its process group, and nothing is left after."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))


def ray_missing() -> str | None:
    """Why a cluster cannot start here (None: it can)."""
    try:
        import ray  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        return "the ray package is not installed (pip install 'corral[ray]')"
    if not os.path.exists(RAY):
        return f"no ray command beside {sys.executable}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    def __init__(self, workers: int = 2, head_cpus: int = 0, worker_cpus: int = 1) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="corral-ray-"))
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            # a killed node is noticed in seconds, not the default half minute
            "RAY_health_check_period_ms": "500",
            "RAY_health_check_failure_threshold": "3",
        }
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        try:
            self._start(
                "head",
                [
                    "--head",
                    "--port",
                    str(self.port),
                    "--num-cpus",
                    str(head_cpus),
                    "--temp-dir",
                    str(self.dir / "head"),
                    "--include-dashboard=false",
                    "--disable-usage-stats",
                ],
            )
            for i in range(workers):
                self.add_worker(f"worker{i + 1}", worker_cpus)
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115  (the child holds it)
        self.nodes[name] = subprocess.Popen(
            [RAY, "start", "--block", "--node-ip-address", "127.0.0.1", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        log.close()
        self._wait_nodes(len(self.nodes))

    def add_worker(self, name: str, cpus: int = 1) -> None:
        # one at a time: two raylets starting together on one host race for names
        self._start(name, ["--address", self.address, "--num-cpus", str(cpus)])

    def alive_nodes(self) -> int:
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                "import ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR');"
                "print(sum(n['Alive'] for n in ray.nodes()))",
                self.address,
            ],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
        )
        return int(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else -1

    def _wait_nodes(self, count: int, timeout: float = 90) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for name, proc in self.nodes.items():
                if proc.poll() is not None:
                    text = (self.dir / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"ray node {name} ended: {text}")
            if self.alive_nodes() >= count:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Ray cluster did not reach {count} nodes")

    def kill(self, name: str) -> None:
        """The node dies at once, as a machine would (SIGKILL to its processes)."""
        proc = self.nodes.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in self.nodes.values():
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + 10
            while time.monotonic() < end and any(p.poll() is None for p in self.nodes.values()):
                time.sleep(0.2)
            time.sleep(0.5)  # the raylets' own children
        for proc in self.nodes.values():
            end = time.monotonic() + 10
            while time.monotonic() < end:  # until the group is empty: nothing left
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
        self.nodes.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
