"""Many sandboxed jobs: ``corral batch JOBS.jsonl --out RESULTS.jsonl``.

    from corral import batch
    for result in batch.run(batch.read_jobs("jobs.jsonl"), placement="local", jobs=4):
        print(result["id"], result["exit"])

Each job is one normal ``corral run`` (its own sandbox, policy, door and proxy)
on the machine the placement chooses: this one, or a node of a Ray cluster
(:mod:`corral.batch_ray`).  A job is tried again only when the *machine* failed
(the sandbox could not be set up, the node died), never because its command
failed.  Results are JSON lines keyed by ``id``; a result file given again is
read first and the jobs it holds are skipped (resume).
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from corral.errors import EXIT_INTERNAL, EXIT_SETUP, CorralError
from corral.paths import inside
from corral.runlog import link_in
from corral.trees import remove_tree

OUTPUT_BYTES = 64 * 1024  # each result keeps at most this much of the job's output
RETRIES = 2  # further attempts of a job whose machine failed
# the keys a job line may have; anything else is an error naming it
JOB_KEYS = {
    "id": "the job's name, unique in the batch (default: its line number)",
    "command": "a list of arguments, or one shell string (run with /bin/sh -c)",
    "workspace": "the job's writable workspace (default: the current directory)",
    "policy": "the policy file (default: the workspace's corral.toml)",
    "timeout": "wall-clock limit, e.g. 10m",
    "memory": "memory limit, e.g. 512M",
    "pids": "process limit",
    "cpus": "CPU limit (and, on Ray, the CPUs the job asks of the scheduler)",
    "env": "names of environment variables passed into the sandbox",
    "files": "files copied into the workspace before the run",
    "artifacts": "workspace paths reported after the run (existence and size)",
}
# corral run's exit codes that mean the sandbox, not the command, failed
MACHINE_CODES = {EXIT_SETUP, EXIT_INTERNAL}

Job = dict[str, Any]
Result = dict[str, Any]


class JobError(ValueError):
    """A job line that cannot run: the result says why (with its line number)."""


def check_job(raw: object, line: int) -> Job:
    """A job from one decoded line; raises JobError naming what is wrong."""
    if not isinstance(raw, dict):
        raise JobError(f"line {line}: a job is a JSON object")
    unknown = sorted(set(raw) - set(JOB_KEYS))
    if unknown:
        raise JobError(f"line {line}: unknown key {unknown[0]!r} (keys: {', '.join(JOB_KEYS)})")
    job: Job = dict(raw)
    job["id"] = str(job.get("id", f"line{line}"))
    command = job.get("command")
    if isinstance(command, str) and command.strip():
        job["argv"] = ["/bin/sh", "-c", command]
    elif isinstance(command, list) and command and all(isinstance(a, str) for a in command):
        job["argv"] = list(command)
    else:
        raise JobError(f"line {line}: command must be a non-empty list of strings or a string")
    for key in ("env", "files", "artifacts"):
        value = job.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise JobError(f"line {line}: {key} must be a list of strings")
    for key in ("workspace", "policy", "timeout", "memory", "pids", "cpus"):
        if key in job and not isinstance(job[key], str | int | float):
            raise JobError(f"line {line}: {key} must be a string or a number")
    job["line"] = line
    return job


def error_result(job_id: str, message: str, line: int | None = None) -> Result:
    result: Result = {"id": job_id, "exit": None, "error": message, "attempts": 0}
    if line is not None:
        result["line"] = line
    return result


def read_jobs(path: str) -> Iterator[Job | Result]:
    """The jobs of a JSON-lines file, in order; a bad line becomes an error result
    (``{"id": "line7", "error": "line 7: ..."}``) and the rest still run."""
    seen: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                raw = json.loads(text)
            except json.JSONDecodeError as exc:
                yield error_result(f"line{number}", f"line {number}: not JSON: {exc.msg}", number)
                continue
            try:
                job = check_job(raw, number)
            except JobError as exc:
                named = isinstance(raw, dict) and isinstance(raw.get("id"), str | int)
                yield error_result(str(raw["id"]) if named else f"line{number}", str(exc), number)
                continue
            _anchor(job, os.path.dirname(os.path.abspath(path)))
            if job["id"] in seen:
                yield error_result(job["id"], f"line {number}: id {job['id']!r} used twice", number)
                continue
            seen.add(job["id"])
            yield job


def _anchor(job: Job, base: str) -> None:
    """Relative paths in a jobs file are relative to that file's directory."""
    for key in ("workspace", "policy"):
        if isinstance(job.get(key), str):
            job[key] = os.path.join(base, job[key])
    job["files"] = [os.path.join(base, f) for f in job.get("files", [])]
    job.setdefault("workspace", base)


def finished_ids(out: str) -> dict[str, bool]:
    """The ids a result file holds already (and whether each exited 0); a last
    line cut short (the batch was killed while writing it) is dropped so it runs
    again."""
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # (a job may have left a link)
    try:
        with os.fdopen(os.open(out, os.O_RDONLY | nofollow), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    keep = data if data.endswith(b"\n") or not data else data[: data.rfind(b"\n") + 1]
    if keep != data:
        with os.fdopen(os.open(out, os.O_WRONLY | os.O_TRUNC | nofollow), "wb") as f:
            f.write(keep)
    ids: dict[str, bool] = {}
    for line in keep.splitlines():
        try:
            result = json.loads(line)
            ids[str(result["id"])] = result.get("exit") == 0
        except (ValueError, KeyError, TypeError):
            continue
    return ids


# -- one job on this machine ---------------------------------------------------------


def _corral() -> list[str]:
    """This installation's corral: its script beside the interpreter (no runpy,
    a few ms less per job), else ``python -m corral``."""
    script = os.path.join(os.path.dirname(sys.executable), "corral")
    if os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-P", "-m", "corral"]  # (-P: the job's directory is not imported from)


def corral_argv(job: Job, report: str, log: str, net_log: str) -> list[str]:
    """``corral run`` for a job (pure: unit-tested)."""
    argv = [*_corral(), "run", "-q", "--report", report]
    argv += ["--log", log, "--net-log", net_log]
    return [*argv, *run_flags(job), "--", *job["argv"]]


def run_flags(job: Job) -> list[str]:
    """The ``corral run`` options a job's keys set (pure).  Jobs with the same
    ones would get the same sandbox: with --reuse they share a warm one."""
    flags = []
    for key in ("policy", "workspace", "timeout", "memory", "pids", "cpus"):
        if key in job:
            flags += [f"--{key}", str(job[key])]
    for name in job.get("env", []):
        flags += ["--env", name]
    for path in job.get(PROTECTED, []):
        flags += ["--write-deny", path]
    if PINNED in job:
        flags += ["--policy-sha256", str(job[PINNED])]
    return flags


PROTECTED = "_protected"  # (not keys a jobs file can set: check_job refuses them)
PINNED = "_policy_sha256"  # the content of the job's policy, read when the batch began


def pin_policies(items: list[Job | Result]) -> list[Job | Result]:
    """Each job's policy, read once when the batch begins, on this machine: the job
    runs only if its file still holds that (``--policy-sha256``), wherever it
    runs.  A job with no ``policy`` gets its workspace's corral.toml, checked here
    as corral run checks one it finds (corral.liveruns), or none (/dev/null):
    left to find one itself, a Ray node loaded a corral.toml another job had
    just planted (this machine's record of live runs is not the node's), and a
    job allowed to write another's policy file made that job run unconfined.
    A job whose policy cannot be pinned becomes its error result."""
    out: list[Job | Result] = []
    for item in items:
        if "argv" in item and PINNED not in item:
            try:
                _pin(item)
            except (OSError, CorralError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) else str(exc)
                item = error_result(item["id"], f"policy: {reason}", item.get("line"))
        out.append(item)
    return out


def _pin(job: Job) -> None:
    import hashlib

    from corral import policy as pol

    workspace = os.path.realpath(str(job.get("workspace") or os.getcwd()))
    path = job.get("policy")
    named = path is not None
    if path is None:
        found = pol.find_policy_file(workspace)
        if found is not None:
            pol.check_found(found)
        path = found or os.devnull
    # (relative to the workspace, where corral run starts: as an unpinned job read it)
    path = os.path.join(workspace, str(path))
    if named:  # checked too: a batch file does not review what a run wrote there since
        pol.check_found(path, named=True)
    with open(path, "rb") as fh:
        job[PINNED] = hashlib.sha256(fh.read()).hexdigest()
    job["policy"] = path


PLACES = "_places"  # every job's workspace, as real paths ending in "/"


def protect(items: list[Job | Result], jobs_file: str) -> None:
    """What the batch reads again is read-only to every job whose workspace holds it:
    the jobs file, each job's policy and its ``files`` (copied into later jobs'
    workspaces).  A job (its workspace is the jobs file's directory by default)
    appended a job with a policy it wrote (tier = "none"), and the resumed batch
    ran that one unconfined.  (Not what the batch writes while jobs run, the
    results and its logs: on landlock a protected file is put back as it was
    after each job, and would lose the lines written meanwhile.)"""
    paths = [os.path.abspath(jobs_file)]
    paths += [str(i["policy"]) for i in items if "argv" in i and isinstance(i.get("policy"), str)]
    paths += [str(f) for i in items if "argv" in i for f in i.get("files", [])]
    places = sorted(
        {
            os.path.realpath(str(i.get("workspace") or os.getcwd())) + "/"
            for i in items
            if "argv" in i
        }
    )
    for item in items:
        if "argv" in item:
            item[PLACES] = places
        if "argv" not in item:
            continue  # (an error result)
        workspace = os.path.realpath(str(item.get("workspace") or os.getcwd()))
        mine = [p for p in dict.fromkeys(paths) if inside(os.path.realpath(p), workspace)]
        if mine:
            item[PROTECTED] = mine


def _lines(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):
        return []


def _copy_in(job: Job) -> None:
    """Copy the job's ``files`` into its workspace, by name in that directory.  An
    earlier run there (any job's, a sandbox's) may have left a symlink or a hard
    link at that name: copied through, it would have written a host file outside
    the workspace (as root, any), so the name is opened without following one
    and must be a plain file of one link, else OSError names it."""
    workspace = str(job.get("workspace") or os.getcwd())
    # every job's workspace is a place a symlink on a source's way may have come from
    places = [str(p) for p in job.get(PLACES, [])] or [os.path.realpath(workspace) + "/"]
    into = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for src in job.get("files", []):
            _copy_one(src, os.path.basename(src), into, places)
    finally:
        os.close(into)


def _copy_one(src: str, name: str, into: int, places: list[str]) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    # The source is read without following a link either: one may lie in a job's
    # workspace, where a job running meanwhile could swap it for a link to a
    # secret (read-only to jobs is only put back after each job, on landlock).
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = "is a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise OSError(exc.errno, f"the files source {src} {why}: not copied") from None
    if link_in(os.path.dirname(os.path.abspath(src)), places):
        os.close(fd)
        raise OSError(errno.ELOOP, f"the files source {src} is reached through a symlink")
    with os.fdopen(fd, "rb") as source:
        try:
            fd = os.open(name, flags, 0o600, dir_fd=into)
        except OSError as exc:
            why = (
                "is a symlink" if exc.errno == errno.ELOOP else f"cannot be written: {exc.strerror}"
            )
            raise OSError(exc.errno, f"the workspace's {name!r} {why}: {src} not copied") from None
        with os.fdopen(fd, "wb") as dest:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise OSError(f"the workspace's {name!r} is not a plain file of one link")
            dest.truncate(0)
            shutil.copyfileobj(source, dest)
            made = os.fstat(source.fileno())
            os.fchmod(fd, stat.S_IMODE(made.st_mode) & 0o777)  # (never a set-ID bit)
            os.utime(fd, ns=(made.st_atime_ns, made.st_mtime_ns))


def _artifacts(job: Job) -> list[dict[str, Any]]:
    """Each artifact's size, of the workspace's own file (a symlink is not followed:
    one a run left would report the size of a host file)."""
    workspace = os.path.realpath(str(job.get("workspace") or os.getcwd()))
    found = []
    for rel in job.get("artifacts", []):
        path = os.path.normpath(os.path.join(workspace, rel))
        size = None
        # a link anywhere on the way (not only the last name) could lead out of the
        # workspace, and the size would tell of a host file (found by attacking corral)
        if os.path.realpath(path) == path and inside(path, workspace):
            try:
                st = os.lstat(path)
                size = st.st_size if stat.S_ISREG(st.st_mode) else None
            except OSError:
                pass
        found.append({"path": rel, "bytes": size})
    return found


def run_job(job: Job, output_bytes: int = OUTPUT_BYTES) -> Result:
    """One attempt of a job as a ``corral run`` here.  ``machine_failed`` in the
    result says whether another attempt may be made; ``records`` holds the run's
    activity-log records and ``net`` its audit lines (merged by the caller)."""
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="corral-batch-") as scratch:
        report, log, net_log = (os.path.join(scratch, n) for n in ("report", "runs", "net"))
        try:
            _copy_in(job)
        except OSError as exc:  # (the job's own workspace: another machine would not help)
            return error_result(job["id"], f"could not start: {exc}")
        try:
            proc = subprocess.run(
                corral_argv(job, report, log, net_log),
                cwd=str(job.get("workspace") or os.getcwd()),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                check=False,
            )
        except OSError as exc:
            return {**error_result(job["id"], f"could not start: {exc}"), "machine_failed": True}
        doc = next(iter(_lines(report)), {})
        result: Result = {
            "id": job["id"],
            "exit": proc.returncode,
            "output": proc.stdout[:output_bytes].decode("utf-8", "replace"),
            "output_truncated": len(proc.stdout) > output_bytes,
            "duration": round(time.monotonic() - began, 4),
            "denials": doc.get("denials", []),
            "artifacts": _artifacts(job),
            "records": _lines(log),
            "net": _lines(net_log),
        }
    if doc.get("error"):
        result["error"] = doc["error"]
    # the sandbox failed to come up (not the command): worth another machine
    result["machine_failed"] = proc.returncode in MACHINE_CODES and "error" in result
    return result


# -- warm sandboxes: corral batch --reuse -------------------------------------------


WARM_SCRATCH = "corral-batch-warm-"


def sweep() -> None:
    """Remove what killed batches on this machine left: empty run cgroups
    (corral.cgroups.sweep_stale), stale live-run markers (corral.liveruns) and
    warm scratch directories whose process is gone."""
    from corral import cgroups, liveruns

    cgroups.sweep_stale()
    liveruns.live_runs()  # (removes the markers no process holds any more)
    base = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(base) if n.startswith(WARM_SCRATCH)]
    except OSError:
        return
    for name in names:
        owner = name[len(WARM_SCRATCH) :].split("-", 1)[0]
        path = os.path.join(base, name)
        try:
            mine = os.lstat(path).st_uid == os.geteuid()
            if not owner.isdigit() or not mine or _alive(int(owner)):
                continue
            remove_tree(path)  # (corral.trees: never follows a link, any depth)
        except OSError:
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class Warm:
    """Long-lived sandboxes, one per distinct set of a job's options, each reset
    after every job (corral.sandbox.Sandbox.reset: the processes a command left
    are killed, its private /tmp, /var/tmp and /dev/shm emptied).  A job costs
    an exec, not a sandbox.  Jobs whose tier cannot be reset run as their own
    ``corral run``.  One Warm per worker thread (or Ray actor)."""

    def __init__(self, output_bytes: int = OUTPUT_BYTES) -> None:
        self.output_bytes = output_bytes
        self.boxes: dict[tuple[str, ...], _Box] = {}  # a job's flags -> its warm sandbox
        self.cold: set[tuple[str, ...]] = set()  # flags whose tier cannot be reset
        sweep()  # what a killed batch here left (a Ray actor's children are killed with it)
        # named with its owner: a sweep removes the scratch of a process that is gone
        self.scratch = tempfile.mkdtemp(prefix=f"{WARM_SCRATCH}{os.getpid()}-")

    def run(self, job: Job) -> Result:
        key = tuple(run_flags(job))
        if key in self.cold:
            return run_job(job, self.output_bytes)
        began = time.monotonic()
        try:
            box = self.boxes.get(key) or self._open(key)
        except CorralError as exc:
            code = getattr(exc, "code", EXIT_SETUP)
            result = error_result(job["id"], str(exc))
            return {**result, "exit": code, "machine_failed": code in MACHINE_CODES}
        if box is None:
            return run_job(job, self.output_bytes)
        return self._exec(job, box, began)

    def _open(self, key: tuple[str, ...]) -> _Box | None:
        """A warm sandbox for these flags (policy built as corral run builds it),
        or None if its tier cannot be reset."""
        from corral import cli
        from corral.sandbox import Sandbox

        opts, _ = cli.parse([*key, "--", "true"], cli.RUN_OPTIONS, positional=True, command="run")
        policy = cli.build_policy(opts)
        net_log = os.path.join(self.scratch, f"net-{len(self.boxes)}.jsonl")
        sandbox = Sandbox(policy, log=False, kind="batch", net_log=net_log)
        if sandbox.tier.reset_dirs(sandbox.plan) is None:
            sandbox.close()
            self.cold.add(key)
            return None
        box = self.boxes[key] = _Box(sandbox, net_log)
        return box

    def _exec(self, job: Job, box: _Box, began: float) -> Result:
        sandbox = box.sandbox
        kept = bytearray()

        def keep(data: bytes) -> None:
            if len(kept) <= self.output_bytes:
                kept.extend(data[: self.output_bytes + 1 - len(kept)])

        try:
            _copy_in(job)
        except OSError as exc:
            return error_result(job["id"], f"could not start: {exc}")
        started = time.time()
        r = sandbox.exec_alone(  # the policy's timeout applies, as to corral run
            job["argv"], cwd=str(job.get("workspace") or os.getcwd()), on_output=keep
        )
        net = box.new_lines()
        # what it created at a write-deny path goes now, as after a corral run: the
        # next job must not find it (a planted .git/hooks/ file, say)
        from corral.launch import quarantine

        moved = [d.to_dict() for d in quarantine(sandbox.plan.quarantine, sandbox.run_id)]
        result: Result = {
            "id": job["id"],
            "exit": r.exit_code,
            "output": bytes(kept[: self.output_bytes]).decode("utf-8", "replace"),
            "output_truncated": len(kept) > self.output_bytes or r.truncated,
            "duration": round(time.monotonic() - began, 4),
            "denials": moved + _net_denials(net, sandbox.policy),
            "artifacts": _artifacts(job),
            "records": [box.record(job, r, started)],
            "net": net,
        }
        if r.timed_out:
            result["timed_out"] = True
        return result

    def close(self) -> list[dict[str, Any]]:
        """Close every sandbox; the audit lines not yet handed out.  Each guardian
        is let finish (its cgroup removed) first: a Ray actor is killed with its
        children right after this returns."""
        rest = []
        for box in self.boxes.values():
            box.sandbox.close(settle=5.0)
            rest += box.new_lines()
        self.boxes.clear()
        remove_tree(self.scratch)
        return rest


class _Box:
    """One warm sandbox of :class:`Warm`: the sandbox, its proxy's audit log and
    how far it has been read, and its policy's digest (the same for every job)."""

    def __init__(self, sandbox: Any, net_log: str) -> None:
        from corral import runlog

        self.sandbox = sandbox
        self.net_log = net_log
        self.offset = 0
        self.digest = runlog.digest(sandbox.policy.to_dict())

    def new_lines(self) -> list[dict[str, Any]]:
        """The audit lines its proxy wrote since the last call (refusals are
        written at once; an allowed request's line may follow within 50 ms)."""
        try:
            with open(self.net_log, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        lines = []
        for raw in data[:end].splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:
                pass
        return lines

    def record(self, job: Job, r: Any, started: float) -> dict[str, Any]:
        """The activity-log record of one job here: the sandbox's run id (its
        audit lines carry it), the job's command and outcome."""
        from corral import runlog

        sandbox = self.sandbox
        return {
            "run_id": sandbox.run_id,
            "kind": "batch",
            "start": runlog.iso(started),
            "end": runlog.iso(time.time()),
            "tier": sandbox.plan.tier,
            "policy_digest": self.digest,
            "workspace": sandbox.policy.workspace,
            "argv": job["argv"],
            "network": sandbox.policy.network.mode,
            "exit": r.exit_code,
            "duration": round(r.duration, 4),
            "timed_out": r.timed_out,
            "reused": True,
        }


def _net_denials(lines: list[dict[str, Any]], policy: Any) -> list[dict[str, Any]]:
    """A job's network refusals, as corral run's report lists them."""
    from corral.net.audit import denial_entries, deny_key
    from corral.report import network

    tally: dict[Any, int] = {}
    for line in lines:
        if line.get("decision") == "deny":
            key = deny_key(line)
            tally[key] = tally.get(key, 0) + 1
    return [d.to_dict() for d in network(denial_entries(tally), policy)] if tally else []


# -- a batch ---------------------------------------------------------------------------


def run(
    jobs: Iterable[Job | Result],
    placement: str = "local",
    *,
    concurrency: int | None = None,
    retries: int = RETRIES,
    output_bytes: int = OUTPUT_BYTES,
    skip: set[str] | None = None,
    address: str | None = None,
    reuse: bool = False,
    late: Callable[[list[dict[str, Any]]], None] | None = None,
) -> Iterator[Result]:
    """Run jobs (from :func:`read_jobs` or dicts with the same keys) and yield one
    result per job as each finishes.  ``placement``: "local" or "ray" (with
    ``address``).  Jobs whose id is in ``skip`` are not run.  ``reuse``: jobs
    with the same options share warm sandboxes, reset between jobs (:class:`Warm`);
    the audit lines their proxies write after the last result go to ``late``
    (default: corral's net.jsonl)."""
    skip = skip or set()
    todo: list[Job] = []
    for number, item in enumerate(jobs, 1):
        if "error" in item and "argv" not in item:
            if item["id"] not in skip:
                yield item
            continue
        job = item if "argv" in item else check_job(item, number)
        if job["id"] in skip:
            continue
        pinned = pin_policies([job])[0]  # (a jobs file's were pinned already)
        if "argv" in pinned:
            todo.append(pinned)
        else:
            yield pinned
    if placement == "ray":
        from corral import batch_ray

        yield from batch_ray.run(
            todo,
            address or "auto",
            concurrency=concurrency,
            retries=retries,
            output_bytes=output_bytes,
            reuse=reuse,
            late=late or _write_net,
        )
        return
    if placement != "local":
        raise CorralError(f"unknown placement {placement!r} (local, ray)")
    workers = concurrency or os.cpu_count() or 1
    yield from _run_local(todo, workers, retries, output_bytes, reuse, late)


def _attempts(job: Job, retries: int, once: Callable[[Job], Result]) -> Result:
    for attempt in range(1, retries + 2):
        result = once(job)
        result["attempts"] = attempt
        if not result.pop("machine_failed", False):
            break
    return result


def _run_local(
    jobs: list[Job],
    concurrency: int,
    retries: int,
    output_bytes: int,
    reuse: bool = False,
    late: Callable[[list[dict[str, Any]]], None] | None = None,
) -> Iterator[Result]:
    import threading

    warm: list[Warm] = []
    mine = threading.local()

    def once(job: Job) -> Result:
        if not reuse:
            return run_job(job, output_bytes)
        if not hasattr(mine, "warm"):  # each worker thread its own sandboxes
            mine.warm = Warm(output_bytes)
            warm.append(mine.warm)
        result: Result = mine.warm.run(job)
        return result

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        pending = {pool.submit(_attempts, job, retries, once) for job in jobs}
        try:
            for future in concurrent.futures.as_completed(pending):
                result = future.result()
                result.setdefault("node", "local")
                yield result
        finally:
            for future in pending:
                future.cancel()
            rest = [line for w in warm for line in w.close()]
            if rest:  # audit lines written after their job's result was made
                (late or _write_net)(rest)


# -- the command -------------------------------------------------------------------


class _Progress:
    """A bar on a terminal (rich, else tqdm, if installed); nothing otherwise."""

    def __init__(self, total: int) -> None:
        self._bar: Any = None
        self._rich: Any = None
        if not sys.stderr.isatty():
            return
        try:
            from rich.console import Console  # type: ignore[import-not-found,unused-ignore]
            from rich.progress import Progress  # type: ignore[import-not-found,unused-ignore]

            # on stderr: stdout stays for the caller
            self._rich = Progress(console=Console(stderr=True), transient=True)
            self._rich.start()
            self._bar = self._rich.add_task("corral batch", total=total)
        except ImportError:
            try:
                from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

                self._bar = tqdm(total=total, unit="job", leave=False)  # stderr by default
            except ImportError:
                pass

    def step(self) -> None:
        if self._rich is not None:
            self._rich.advance(self._bar)
        elif self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
        elif self._bar is not None:
            self._bar.close()


def main(opts: dict[str, object], jobs_file: str) -> int:
    """``corral batch``: 0 when every job ran and exited 0, 1 otherwise."""
    out = str(opts.get("out") or "")
    if not out:
        raise CorralError("corral batch JOBS.jsonl --out RESULTS.jsonl: --out is required")
    try:
        items = list(read_jobs(jobs_file))
    except OSError as exc:
        raise CorralError(f"cannot read {jobs_file}: {exc.strerror}") from None
    concurrency = _int(opts, "jobs", 0) or None
    retries = _int(opts, "retries", RETRIES)
    output_bytes = _int(opts, "output_bytes", OUTPUT_BYTES)
    address = str(opts.get("ray") or "")
    if address:
        from corral import batch_ray

        batch_ray.connect(address)  # one line and 122 if it cannot
    log = str(opts.get("log") or "") or None
    net_log = str(opts.get("net_log") or "") or None
    items = pin_policies(items)
    protect(items, jobs_file)
    done = finished_ids(out)
    todo = [i for i in items if i["id"] not in done]
    failed = sum(1 for i in items if i["id"] in done and not done[i["id"]])
    progress = _Progress(len(todo))
    try:  # (no link followed: a job may have left one where the results go)
        from corral.runlog import open_log

        sink = os.fdopen(open_log(out), "a", encoding="utf-8")
    except OSError as exc:
        progress.close()
        raise CorralError(f"cannot write {out}: {exc.strerror}") from None
    try:
        with sink:
            for result in run(
                todo,
                "ray" if address else "local",
                concurrency=concurrency,
                retries=retries,
                output_bytes=output_bytes,
                address=address or None,
                reuse=bool(opts.get("reuse")),
                late=lambda lines: _write_net(lines, net_log),
            ):
                _merge_logs(result, log, net_log)
                failed += result.get("exit") != 0
                if "line" in result:  # a job line that could not be a job: say so now
                    print(f"corral: {jobs_file}: {result.get('error')}", file=sys.stderr)
                sink.write(json.dumps(result, sort_keys=True) + "\n")
                sink.flush()
                progress.step()
    finally:
        progress.close()
    if failed:
        print(
            f"corral batch: {failed} of {len(items)} jobs did not succeed; see {out}",
            file=sys.stderr,
        )
    return 1 if failed else 0


def _merge_logs(result: Result, log: str | None, net_log: str | None) -> None:
    """Every run's records and audit lines into the caller's logs, one place."""
    from corral import runlog

    for record in result.pop("records", []):
        record["batch_id"] = result["id"]
        record.setdefault("node", result.get("node"))
        runlog.append(record, log)
    lines = result.pop("net", [])
    for line in lines:
        line["batch_id"] = result["id"]
        line.setdefault("node", result.get("node"))
    _write_net(lines, net_log)


def _write_net(lines: list[dict[str, Any]], net_log: str | None = None) -> None:
    """Audit lines into the caller's net log (default: corral's net.jsonl)."""
    if not lines:
        return
    from corral.net import audit
    from corral.runlog import open_log

    path = net_log or audit.default_path()
    with os.fdopen(open_log(path), "a", encoding="utf-8") as f:  # (no link followed)
        for line in lines:
            f.write(json.dumps(line, sort_keys=True) + "\n")


def _int(opts: dict[str, object], key: str, default: int) -> int:
    value = opts.get(key)
    if value is None:
        return default
    try:
        number = int(str(value))
    except ValueError:
        raise CorralError(
            f"--{key.replace('_', '-')} wants a whole number, not {value!r}"
        ) from None
    if number < 0:
        raise CorralError(f"--{key.replace('_', '-')} wants a number >= 0, not {number}")
    return number
