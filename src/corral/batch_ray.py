"""The Ray placement of :mod:`corral.batch`: one Ray task per job.

The task runs on whichever node Ray's scheduler picks (the job's ``cpus``, 1 by
default, is what it asks for) and there does exactly what a local job does: a
``corral run`` with that node's corral, so the sandbox, the door and the
governing proxy are built on that node, one proxy per run.  The run's records
and audit lines travel back in the result and the caller merges them into one
log.  A task lost with its node (or whose sandbox could not be set up) is
submitted again, to any node; a result is yielded once per job.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

from corral.errors import EXIT_REFUSED, RefusedError

Job = dict[str, Any]
Result = dict[str, Any]

FIX = "install it with: pip install 'corral[ray]'"


def _ray() -> Any:
    try:
        import ray  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise RefusedError(f"--ray needs the ray package, which is not installed: {FIX}") from None
    return ray


def _reachable(address: str) -> str | None:
    """Why a host:port cannot be reached (None: it can).  ray.init alone would
    wait a minute or more on a dead address."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None  # "auto", "ray://...": ray.init decides
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def connect(address: str) -> None:
    """Join the cluster at ``address`` (once per process); one line and exit 122
    when the package is missing or the cluster cannot be reached."""
    ray = _ray()
    if ray.is_initialized():
        return
    fix = "start one with: ray start --head, or pass its address as HOST:PORT"
    why = _reachable(address)
    if why is not None:
        raise RefusedError(f"cannot reach the Ray cluster at {address}: {why}; {fix}")
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except Exception as exc:  # ray raises ConnectionError, RuntimeError, ValueError...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RefusedError(f"cannot join the Ray cluster at {address}: {first}; {fix}") from None


def on_node(job: Job, output_bytes: int) -> Result:
    """The task body: one attempt of the job on this node."""
    from corral import batch

    return _placed(batch.run_job(job, output_bytes))


class WarmWorker:
    """A Ray actor (``--reuse``): warm sandboxes on its node, reset between jobs
    (corral.batch.Warm), so a job costs an exec there, not a sandbox."""

    def __init__(self, output_bytes: int) -> None:
        from corral import batch

        self.warm = batch.Warm(output_bytes)

    def run(self, job: Job) -> Result:
        return _placed(self.warm.run(job))

    def close(self) -> list[dict[str, Any]]:
        return self.warm.close()


def _placed(result: Result) -> Result:
    """A result as it leaves its node: the node's id, and a refusal in words."""
    import ray  # type: ignore[import-not-found,unused-ignore]

    result["node"] = ray.get_runtime_context().get_node_id()
    if result.get("exit") == EXIT_REFUSED:
        # this node cannot give the job's policy: refused here, never run weaker
        reason = str(result.get("output", "")).strip().splitlines()
        result["error"] = f"refused on node {result['node'][:12]}: " + (
            reason[0] if reason else "the node cannot honour the policy"
        )
    return result


def run(
    jobs: list[Job],
    address: str,
    *,
    concurrency: int | None = None,
    retries: int = 2,
    output_bytes: int = 64 * 1024,
    reuse: bool = False,
    late: Callable[[list[dict[str, Any]]], None] | None = None,
) -> Iterator[Result]:
    connect(address)
    ray = _ray()
    if reuse:
        yield from _run_warm(jobs, concurrency, retries, output_bytes, late)
        return
    task = ray.remote(on_node)
    limit = concurrency or len(jobs) or 1
    queue = list(reversed(jobs))
    inflight: dict[Any, tuple[Job, int]] = {}

    def submit(job: Job, attempt: int) -> None:
        cpus = float(job.get("cpus", 1))
        ref = task.options(num_cpus=cpus, max_retries=0).remote(job, output_bytes)
        inflight[ref] = (job, attempt)

    while queue or inflight:
        while queue and len(inflight) < limit:
            submit(queue.pop(), 1)
        ready, _ = ray.wait(list(inflight), num_returns=1)
        ref = ready[0]
        job, attempt = inflight.pop(ref)
        try:
            result = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # corral itself raised on the node
            result = {"id": job["id"], "exit": None, "error": f"on the node: {exc.cause}"}
        except ray.exceptions.RayError as exc:  # the worker or its node died
            if attempt <= retries:
                submit(job, attempt + 1)
                continue
            result = {"id": job["id"], "exit": None, "error": f"the node failed: {exc}"}
        if result.pop("machine_failed", False) and attempt <= retries:
            submit(job, attempt + 1)
            continue
        result["attempts"] = attempt
        yield result


def _run_warm(
    jobs: list[Job],
    concurrency: int | None,
    retries: int,
    output_bytes: int,
    late: Callable[[list[dict[str, Any]]], None] | None,
) -> Iterator[Result]:
    """Jobs on a pool of :class:`WarmWorker` actors, one CPU each (as many as the
    cluster has, or ``concurrency``), each given one job at a time.  The job of
    an actor lost with its node is submitted again, to the actors left (a new
    one is asked for only if none is: the dead node's CPUs are gone, and the
    others are held by the live actors); a result is yielded once per job."""
    ray = _ray()
    actor = ray.remote(num_cpus=1, max_restarts=0)(WarmWorker)
    size = concurrency or max(1, int(ray.cluster_resources().get("CPU", 1)))
    size = max(1, min(size, len(jobs)))
    idle = [actor.remote(output_bytes) for _ in range(size)]
    queue = list(reversed(jobs))
    inflight: dict[Any, tuple[Job, int, Any]] = {}
    try:
        while queue or inflight:
            while queue and idle:
                worker = idle.pop()
                job = queue.pop()
                attempt = job.pop("_attempt", 1)
                inflight[worker.run.remote(job)] = (job, attempt, worker)
            ready, _ = ray.wait(list(inflight), num_returns=1)
            job, attempt, worker = inflight.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:  # the actor or its node died
                if not idle and not inflight:  # none left: a new one, where Ray has room
                    idle.append(actor.remote(output_bytes))
                if attempt <= retries:
                    queue.append({**job, "_attempt": attempt + 1})
                    continue
                result = {"id": job["id"], "exit": None, "error": f"the node failed: {exc}"}
                yield {**result, "attempts": attempt}
                continue
            except ray.exceptions.RayTaskError as exc:  # corral itself raised on the node
                result = {"id": job["id"], "exit": None, "error": f"on the node: {exc.cause}"}
            idle.append(worker)
            if result.pop("machine_failed", False) and attempt <= retries:
                queue.append({**job, "_attempt": attempt + 1})
                continue
            result["attempts"] = attempt
            yield result
    finally:
        # each actor closes its sandboxes and hands over its late audit lines
        workers = idle + [w for _, _, w in inflight.values()]
        rest: list[dict[str, Any]] = []
        for ref in [w.close.remote() for w in workers]:
            try:
                rest += ray.get(ref, timeout=60)
            except ray.exceptions.RayError:
                pass  # gone with its node: its sandboxes went with it
        for w in workers:
            ray.kill(w)
        if rest and late is not None:
            late(rest)
