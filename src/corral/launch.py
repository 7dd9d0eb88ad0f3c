"""The thin layer that runs a :class:`~corral.tiers.base.Plan`.

Everything with side effects that every tier shares lives here: cgroups, file
descriptors, the output pump with its bound, the timeout, signals, and the
cleanup that must happen even when corral itself is killed (a small guardian
process).  What differs by tier (how the process tree is started and killed,
what is left to remove) is the plan's
:class:`~corral.tiers.base.LaunchStrategy`; nothing here asks which tier runs.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time

try:  # the C module: `signal` itself imports enum (~2 ms on every run)
    import _signal as signal  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - other Pythons
    import signal  # type: ignore[no-redef, unused-ignore]

from corral.errors import EXIT_TIMEOUT, SetupError, SetupRaced

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol

    from corral.cgroups import CgroupRun
    from corral.liveruns import Marker
    from corral.lockwatch import LockWatch
    from corral.netns import Resolver
    from corral.prompt import TerminalPrompt
    from corral.report import Denial
    from corral.tiers.base import Plan

    class Companion(Protocol):
        """A process a run needs beside its sandbox (the CLI's proxy).  ``fork``
        runs in whichever process forks it: the run's guardian when there is one
        (so the fork costs corral's own process nothing: no page tables copied,
        no page copied on write afterwards), else corral's process just before
        the launch.  ``forked`` then runs in corral's process, and
        ``sandbox_ended`` once the sandbox has ended (not after a setup that
        raced: the next attempt uses the same companion)."""

        def fork(self) -> None: ...

        def forked(self) -> None: ...

        def sandbox_ended(self) -> None: ...


CHUNK = 65536
EXIT_GRACE = 0.2  # seconds to drain pipes after the command exits (tier none)
# A sandbox told to stop (timeout, forwarded signal) that is still there this many
# seconds later is told again, in case a stop is ever lost (see spawn_held: one was,
# by a landlock reaper, until its fork held the signals)
STOP_AGAIN = 2.0
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Python ignores these and an ignored signal survives exec: give the command the
# defaults any shell would (a pipeline reader that exits kills `yes` with SIGPIPE).
RESET_SIGNALS = (*FORWARDED_SIGNALS, signal.SIGPIPE, signal.SIGXFSZ)


class RunResult:
    __slots__ = (
        "denials",
        "duration",
        "exit_code",
        "limits_hit",
        "lookups",
        "output_bytes",
        "signal",
        "timed_out",
        "truncated",
    )

    def __init__(self) -> None:
        self.exit_code = 0
        self.timed_out = False
        self.truncated = False
        self.duration = 0.0
        self.output_bytes = 0  # bytes the command wrote, kept or not
        self.limits_hit: list[str] = []
        self.denials: list[Denial] = []  # what the run's own files told (corral.report)
        self.signal: int | None = None  # a signal corral received and acted on
        # names a sandbox without a network tried to look up: (name, record type)
        self.lookups: list[tuple[str, str]] = []


def new_run_id() -> str:
    return f"{int(time.time() * 1000):x}-{os.urandom(3).hex()}"


def _status_value(text: str, key: str) -> int | None:
    """Pull an integer out of bwrap's JSON status stream without importing json."""
    marker = f'"{key}":'
    at = text.find(marker)
    if at < 0:
        return None
    digits = text[at + len(marker) :].lstrip().split(",", 1)[0].split("}", 1)[0].strip()
    return int(digits) if digits.lstrip("-").isdigit() else None


def root_pidfd(status_text: str) -> int:
    """A pidfd for the process bwrap reported as its child (the sandbox's root, in
    its own session), or -1.  Killing bwrap is not always enough: that child sets
    its own parent-death signal after the clone, and one whose bwrap was killed
    first ran on (seen 1 run in 200, a SIGTERM to corral as it launched), holding
    the output pipes; as a user without a cgroup nothing would have ended it."""
    pid = _status_value(status_text, "child-pid")
    return pidfd_of(pid) if pid is not None else -1


def pidfd_of(pid: int) -> int:
    """A pidfd for ``pid``, or -1 (none such, or gone already)."""
    if pid <= 0:
        return -1
    try:
        return os.pidfd_open(pid)
    except OSError:
        return -1


def kill_root(pidfd: int) -> None:
    """SIGKILL the root :func:`root_pidfd` found (its pid namespace goes with it)."""
    if pidfd >= 0:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass


def open_fds() -> list[int] | None:
    """Every descriptor open in this process now (one readdir), or None without /proc."""
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return None


def _close_all_but(keep: dict[int, int]) -> None:
    """In the child: close every descriptor except 0, 1, 2 and ``keep``'s numbers.

    Listed from /proc rather than closed by range: a range must end somewhere, and
    a descriptor above it (a raised RLIMIT_NOFILE) would cross into the sandbox."""
    found = open_fds()
    if found is None:
        import resource

        ceiling = max(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        found = list(range(3, ceiling if ceiling != resource.RLIM_INFINITY else 1 << 20))
    for fd in found:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def dup_moves(wanted: dict[int, int]) -> tuple[list[tuple[int, int]], list[int]]:
    """The dup2 calls, in order, that leave each target number holding what its
    source held, however sources and targets overlap (``{0: 5, 5: 7}``); and the
    numbers they use for copies, which the caller closes.  Every source is first
    copied above every number involved, then each copy is put in place, so no
    dup2 lands on a source still to be read.  Run in a child (after fork, or as
    posix_spawn's file actions), where overwriting a descriptor that is neither
    a source nor a target is harmless: it is closed before the exec anyway.
    Pure: no ``fcntl`` import (F_DUPFD) on the path of every run."""
    base = max([2, *wanted, *wanted.values()]) + 1
    parked = [base + i for i in range(len(wanted))]
    moves = list(zip(wanted.values(), parked, strict=True))
    moves += list(zip(parked, wanted, strict=True))
    return moves, parked


def move_fds_into_place(wanted: dict[int, int]) -> None:
    """In the child: make fd ``target`` refer to ``source`` for each pair, then close the
    rest: nothing the caller holds crosses unless it is asked for."""
    moves, _ = dup_moves(wanted)
    for source, target in moves:
        os.dup2(source, target, inheritable=True)
    _close_all_but(wanted)  # the parked copies among the rest


class _Guardian:
    """A forked process that cleans up if corral dies before it can.

    It waits on a pipe: corral sends the sandbox's pid once launched, then one
    ``k`` when it has cleaned up itself.  End-of-file without the ``k`` means
    corral was killed: the guardian waits for the sandbox to be gone, then
    removes the cgroup, quarantines and restores.
    """

    def __init__(
        self,
        cleanup: Callable[[int], None],
        later: Callable[[], None] | None = None,
        hold: int = -1,
        first: Callable[[], None] | None = None,
        live: int = -1,
    ) -> None:
        """``hold``: a descriptor the guardian keeps open until it exits, so that
        the last close (slow for some kinds, see corral.lockwatch) is not corral's;
        ``first``: what the guardian does before anything else (fork a companion,
        which then stays in corral's session); ``live``: the run's marker
        (corral.liveruns), whose lock the guardian holds too until it exits, so
        that the run stays live while it cleans up after a killed corral."""
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # guardian
            try:
                for sig in FORWARDED_SIGNALS:  # (then let go: Aftercare held them)
                    signal.signal(sig, signal.SIG_IGN)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
                if first is not None:
                    first()
                os.setsid()  # survives a kill of corral's process group
                null = os.open(os.devnull, os.O_RDWR)
                keep = {0: null, 1: null, 2: null, 3: rfd}
                if hold >= 0:
                    keep[4] = hold
                if live >= 0:
                    keep[5] = live
                move_fds_into_place(keep)
                said, root = b"", -1
                while chunk := os.read(3, 64):
                    said += chunk
                    if root < 0 and b";" in said:  # its pidfd now, before any pid is reused
                        token = said.split(b"r")[-1].split(b";")[0]
                        root = pidfd_of(int(token)) if token.isdigit() else -1
                if not said.endswith(b"k"):
                    kill_root(root)  # (a sandbox's init that outlived bwrap goes, tree and all)
                    pids = [int(p) for p in said.split(b"p")[1:] if p.strip().isdigit()]
                    cleanup(pids[-1] if pids else 0)
                elif said.endswith(b"lk") and later is not None:
                    later()  # what corral left to finish after it returned
            finally:
                os._exit(0)
        os.close(rfd)
        self.pid = pid
        self.wfd = wfd

    def launched(self, pid: int) -> None:
        os.write(self.wfd, f"p{pid}".encode())

    def rooted(self, pid: int) -> None:
        """The sandbox's root below bwrap (see root_pidfd): killed if corral dies."""
        os.write(self.wfd, f"r{pid};".encode())

    def release(self, later: bool = False) -> None:
        """Tell the guardian all is clean (or, with ``later``, that its ``later``
        step is left to do); it exits on its own.

        Not waited for here (that costs a scheduling round trip on every run);
        :meth:`reap` collects it later, or init does once corral exits.
        """
        os.write(self.wfd, b"lk" if later else b"k")
        os.close(self.wfd)

    def reap(self, wait: float = 0.0) -> None:
        """Collect the guardian if it has exited; ``wait``: for up to so many seconds."""
        deadline = time.monotonic() + wait
        pause = 0.001
        while True:
            try:
                done, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return
            if done or time.monotonic() >= deadline:
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


class Aftercare:
    """Everything a run sets up around the sandbox and must undo: the cgroup, the
    scratch directory, quarantine of created write-deny paths and restoring
    changed ones.  A guardian does the undoing if corral is killed first."""

    def __init__(self, plan: Plan, run_id: str, companion: Companion | None = None) -> None:
        """``companion``: forked by the guardian, if this run has one (see
        ``companion_forked``); else left to the caller.

        A SIGTERM (or SIGINT, SIGHUP) to corral between the cgroup's creation and
        the guardian's fork would kill corral with nothing to undo what it made
        (seen: cgroups and scratch directories left by runs signalled as they
        started): held until the guardian exists, then corral dies of it as
        before, and the guardian cleans up."""
        held = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
        try:
            self._set_up(plan, run_id, companion)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def _set_up(self, plan: Plan, run_id: str, companion: Companion | None) -> None:
        self.plan = plan
        self.run_id = run_id
        self.cg: CgroupRun | None = None
        self.snapshot: dict[str, object] = {}
        self.guardian: _Guardian | None = None
        self.clean = False  # the sandbox ended on its own: nothing to remove by force
        self.done = False  # the strategy's cleanup ran
        self.companion_forked = False
        self.marker: Marker | None = None
        if plan.strategy.confines:  # nothing set up yet: a refusal leaves nothing behind
            self._refuse_unsafe()
        if plan.cgroup is not None:
            from corral.cgroups import CgroupRun

            self.cg = CgroupRun(plan.cgroup, run_id)
            self.cg.create()
        try:
            if plan.restore:
                from corral import restore

                try:
                    self.snapshot = dict(restore.snapshot(plan.restore, plan.restore))
                except (restore.TooLarge, OSError) as exc:
                    from corral.errors import RefusedError

                    raise RefusedError(
                        f"cannot protect a write-deny path or a secret in the workspace: {exc}"
                    ) from None
            if plan.scratch:
                prepare_scratch(plan)
            if plan.home is not None:
                prepare_home(plan)
        except BaseException:
            if self.cg is not None:
                self.cg.remove()
            if plan.scratch:
                remove_scratch(plan)
            raise
        # set before the sandbox starts, so no refused write can slip past it
        self.watch: LockWatch | None = None
        if plan.lock_watch:
            from corral.lockwatch import LockWatch

            self.watch = LockWatch(plan.lock_watch)
        if plan.strategy.confines:
            # live until the aftercare is done: a policy file it writes meanwhile
            # is refused by any run started then (corral.liveruns)
            from corral import liveruns

            self.marker = liveruns.register(run_id, self._places())
        if (
            self.cg is not None
            or plan.quarantine
            or plan.restore
            or plan.scratch
            or plan.strategy.needs_guardian()
            or (plan.home is not None and plan.home.mode == "ephemeral")
            or self.watch is not None
            or self.marker is not None
        ):
            # the guardian also holds the watch: tearing an inotify instance down
            # waits for an RCU grace period (about 14 ms here), which its exit pays
            hold = self.watch.fd if self.watch is not None else -1
            first = companion.fork if companion is not None else None
            live = self.marker.fd if self.marker is not None else -1
            try:
                self.guardian = _Guardian(
                    self._emergency, self.cg.remove if self.cg else None, hold, first, live
                )
            except BaseException:
                if self.marker is not None:
                    self.marker.remove()
                raise
            self.companion_forked = first is not None

    def _refuse_unsafe(self) -> None:
        """RefusedError when this run must not start where it would: an earlier
        run's aftercare was left unfinished there (corral.unfinished), or what
        corral runs on the host lies where the run can write (corral.selfguard)."""
        from corral import selfguard, unfinished
        from corral.errors import RefusedError

        places = self._places()
        unfinished.check(places)
        why = selfguard.refusal(places, self.plan.argv)
        if why:
            raise RefusedError(why)

    def _places(self) -> list[str]:
        """Where the run can write (real paths), the home layer too."""
        places = [os.path.realpath(p) for p in self.plan.policy.writable_paths()]
        if self.plan.home is not None:  # the home layer too: a run writes there as well
            places.append(os.path.realpath(self.plan.home.path))
        return places

    def launched(self, pid: int) -> None:
        if self.guardian is not None:
            self.guardian.launched(pid)

    def rooted(self, pid: int) -> None:
        if self.guardian is not None:
            self.guardian.rooted(pid)

    def _emergency(self, pid: int) -> None:
        # what outlives corral (an engine's container outlives its client) goes
        # first, then wait as for any sandbox
        self.plan.strategy.cleanup(self.plan, False, pid)
        self.done = True
        # let the sandbox go first (die-with-parent, or the reaper's sweep)
        deadline = time.monotonic() + 5
        while pid and time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:
                break
            time.sleep(0.01)
        time.sleep(0.05)
        self._undo()

    def _undo(self, wait: bool = True) -> list[Denial]:
        """Every step of the undo, in order, each whatever an earlier one raised
        (a restore that broke on a tree the run made once left a planted hook, a
        renamed secret and the run's marker behind: found by attacking corral);
        the first error is raised again once all have run."""
        said: list[Denial] = []
        failed: list[Exception] = []
        for step in (
            self._stop,
            lambda: self.cg.remove(wait) if self.cg is not None else None,
            # first what a rename carried off goes back where it was: the walk below
            # judges policy files new by their path, and would take the user's own,
            # carried to a new one, for the run's (and leave the run's at the old path)
            self._restore,
            lambda: quarantine(self.plan.quarantine, self.run_id),
            lambda: created_repositories(self.plan, self.run_id),
            self._remove_scratch,
            self._remove_ephemeral_home,
            # what could not be undone refuses later runs there, before the run
            # stops being live (a policy file it left is refused meanwhile)
            lambda said=said: self._hold(said),  # (the list: it grows; not functools.partial,
            # which costs every run 5 ms to import)
            self._unmark,  # last: what it made is quarantined now
        ):
            try:
                said += step() or []
            except Exception as exc:  # (a bug's traceback is the caller's to report)
                failed.append(exc)
        if failed:
            raise failed[0]
        return said

    def _hold(self, said: list[Denial]) -> list[Denial]:
        """Refuse later runs where this one left what corral could not undo
        (corral.unfinished); the line that says so, if any."""
        from corral import unfinished

        lines = unfinished.left(said)
        if not lines:
            return []
        return [unfinished.record(self.run_id, self._places(), lines)]

    def _stop(self) -> None:
        if not self.done:
            self.done = True
            self.plan.strategy.cleanup(self.plan, self.clean)

    def _restore(self) -> list[Denial]:
        if not self.snapshot:
            return []
        from corral import restore

        roots = [os.path.realpath(p) for p in self.plan.policy.writable_paths()]
        if self.plan.home is not None:
            roots.append(self.plan.home.path)
        return restore.restore(
            self.snapshot,  # type: ignore[arg-type]
            self.run_id,
            self.plan.restore,
            roots,
        )

    def _remove_scratch(self) -> None:
        if not self.plan.scratch:
            return
        try:
            os.rmdir(self.plan.scratch)  # usually empty: no shutil import (~5 ms)
        except FileNotFoundError:
            pass
        except OSError:
            from corral.trees import remove_tree

            remove_tree(self.plan.scratch)

    def _remove_ephemeral_home(self) -> None:
        if self.plan.home is not None and self.plan.home.mode == "ephemeral":
            from corral import home

            home.remove(self.plan.home.path)

    def _unmark(self) -> None:
        if self.marker is not None:
            self.marker.keep(list(self.plan.restore))
            self.marker.remove()

    def finish(self) -> list[Denial]:
        """Undo everything (the sandbox is gone); the denials found on the way."""
        # The sandbox's last process may still be exiting (bwrap's init tears its
        # mounts down after bwrap has told us the exit code): its cgroup is left
        # for the guardian to remove rather than waited for on every run.
        said = self._undo(wait=self.guardian is None)
        if self.watch is not None:
            said += self.watch.finish()
            self.watch = None
        if self.guardian is not None:
            self.guardian.release(later=self.cg is not None and bool(self.cg.dirs))
        return said


def not_through_links(path: str, plain: dict[str, bool] | None = None) -> str:
    """``path``, or the first of its directories that is now a symlink: what to move
    when the run may have replaced a directory on the way (the link, never what it
    leads to).  ``plain`` remembers the directories found link-free, for a list of
    paths that share them (a realpath per path costs a run about half a millisecond)."""
    parent = os.path.dirname(path)
    if plain is None:
        plain = {}
    if parent not in plain:
        plain[parent] = os.path.realpath(parent) == parent
    if plain[parent]:
        return path
    where = ""
    for part in parent.strip("/").split("/"):
        where += "/" + part
        if os.path.islink(where):
            return where
    return path  # (changed back in between: as it was named)


def quarantine(paths: list[str], run_id: str) -> list[Denial]:
    """Move anything created at a write-deny path out of the workspace; say what moved.

    A path is named as it was at launch, with no symlink on the way.  If one of
    its directories is a symlink now, the run made it (to lead the move to a
    directory it could not write, another repository's hooks): the symlink
    itself is moved, never what it leads to.  This check comes before the move:
    one made at the move (another sandbox in the workspace swapping a directory
    in between) is :func:`corral.quarantine.move_out`'s, by descriptors."""
    moved = []
    seen = set()
    plain: dict[str, bool] = {}
    for named in paths:
        path = not_through_links(named, plain)
        if path in seen or not os.path.lexists(path):
            continue
        seen.add(path)
        from corral.quarantine import move_out
        from corral.report import quarantined

        dest, error = move_out(path, run_id)
        moved.append(quarantined(path, dest, error, via=named if path != named else ""))
    return moved


def created_repositories(plan: Plan, run_id: str) -> list[Denial]:
    """What in a repository the run made would run code on the host, and protected
    entries it made in subdirectories (a corral.toml, a .vscode/...), quarantined."""
    if plan.repositories is None:
        return []
    from corral import fsplan

    # the roots the launch walked (real paths: a git dir reached through a symlink
    # must not pass for one inside)
    roots = plan.repositories.roots
    scan = fsplan.created_repositories(roots, plan.repositories)
    if scan is None:
        return []
    from corral import gitguard
    from corral.quarantine import move_out
    from corral.report import new_policy_file

    said = [
        new_policy_file(path, *move_out(path, run_id))
        for path in fsplan.new_protected(scan, plan.repositories)
    ]
    said += gitguard.quarantine(gitguard.findings(roots, scan, plan.repositories.known), run_id)
    if not scan.complete:
        from corral.defaults import SCAN_MAX_ENTRIES
        from corral.report import repositories_unchecked

        said.append(repositories_unchecked(SCAN_MAX_ENTRIES))
    return said


def run(
    plan: Plan,
    run_id: str,
    out_fd: int = 1,
    err_fd: int = 2,
    in_fd: int = 0,
    on_output: Callable[[int, bytes], None] | None = None,
    asks: TerminalPrompt | None = None,
    companion: Companion | None = None,
) -> RunResult:
    """Launch ``plan`` and pump its output until it ends; the caller handles errors.
    ``asks``: the terminal prompt that answers the proxy's asks (corral.prompt);
    ``companion``: a process to fork beside the sandbox, in the host's namespaces
    (the CLI's proxy): by the run's guardian if it has one, else by this process
    just before it sets up and spawns the sandbox (see :class:`Companion`).

    For the CLI: a process that runs this one sandbox.  When the plan has a
    network namespace to make, this process moves into it before starting the
    sandbox (no fork needed: bwrap is still spawned), and answers the resolver
    of a sandbox without a network itself.  :func:`start` forks for it instead."""
    result = RunResult()
    # stdin is the one descriptor of the caller's the command gets as it is (see
    # stdin_feed); a terminal there is the user's own: its state is put back after
    stdin_st = fd_stat(in_fd) if plan.strategy.confines else None
    tty = TtyState.save(in_fd, stdin_st)
    care = Aftercare(plan, run_id, companion)
    beside = companion
    if companion is not None and care.companion_forked:
        companion.forked()
        companion = None
    start = time.monotonic()
    try:
        _launch_and_pump(
            plan, result, care, out_fd, err_fd, in_fd, on_output, asks, companion, stdin_st
        )
        if beside is not None:  # it may begin to stop while the aftercare runs
            beside.sandbox_ended()
        # a killed engine client leaves its container behind; a clean exit does not
        care.clean = not result.timed_out and result.signal is None
    finally:
        result.duration = time.monotonic() - start
        if care.cg is not None:
            result.limits_hit = care.cg.limits_hit()
        result.limits_hit += plan.strategy.limits_hit(plan)
        result.denials += care.finish()
        if tty is not None:  # the sandbox is gone: nothing can change it again
            tty.restore()
    if result.timed_out:
        result.limits_hit.append("timeout")
    return result


def prepare_scratch(plan: Plan) -> None:
    """Make the plan's private directory and its files (mode 0700: ours alone)."""
    assert plan.scratch is not None
    try:
        os.mkdir(plan.scratch, 0o700)
    except OSError as exc:
        raise SetupError(f"cannot create the scratch directory: {exc}") from None
    try:
        for name, data, mode in plan.prepare:
            fd = os.open(
                os.path.join(plan.scratch, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode
            )
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
    except OSError as exc:
        remove_scratch(plan)
        raise SetupError(f"cannot prepare {plan.scratch}: {exc.strerror or exc}") from None


def prepare_home(plan: Plan) -> None:
    """Create and seed the run's home layer (corral.home)."""
    from corral import home

    assert plan.home is not None
    try:
        home.prepare(plan.home)
    except home.HomeError as exc:
        if plan.home.mode == "ephemeral":
            home.remove(plan.home.path)
        raise SetupError(str(exc)) from None


def remove_scratch(plan: Plan) -> None:
    if plan.scratch is None:
        return
    from corral.trees import remove_tree

    remove_tree(plan.scratch)


def unpassable(fd: int) -> str | None:
    """Why the caller's descriptor ``fd`` may not be handed to a sandboxed command
    (words to follow "descriptor N"), or None.  A descriptor is the host's own
    open file, met by no mount, mask or read-only bind of the sandbox: a
    directory (or an O_PATH) opens its whole tree by openat, and a regular file
    opens again through /proc/self/fd/N with any mode the user may have
    (written though passed read-only) and takes fchmod and futimens.  A pipe,
    a socket or a device such as /dev/null gives nothing beyond itself.  Not
    replaced by a pipe as stdin is: a passed file is asked for when a stream is
    not enough (seek, size, mmap, writing back), and a pipe would change that
    silently; the refusal names the stream to pass instead."""
    import fcntl

    st = os.fstat(fd)
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_PATH:
        return "is an O_PATH descriptor: a handle on a host path, not a stream"
    if stat.S_ISDIR(st.st_mode):
        return (
            "is a directory: the command would open the host's tree under it through "
            "it, past every mask and read-only mount of the sandbox"
        )
    if (stat.S_ISREG(st.st_mode) and st.st_nlink) or stat.S_ISBLK(st.st_mode):
        # (nlink 0: a memfd or a deleted file; reopened it is itself, no host path)
        return (
            "is a file on the host: the command could reopen it for writing through "
            f"/proc/self/fd/{fd}; pass a pipe instead ({fd}< <(cat FILE))"
        )
    return None


def fd_stat(fd: int) -> os.stat_result | None:
    try:
        return os.fstat(fd)
    except OSError:
        return None


def stdin_feed(in_fd: int, st: os.stat_result | None = None) -> tuple[int, int] | None:
    """For a confined run: when ``in_fd`` is a file behind which lies the host's
    tree (a regular file, a block device, a directory: see :func:`unpassable`),
    (the descriptor the command gets as stdin, the pipe's write end corral fills
    from ``in_fd``, or -1: nothing to fill); None when ``in_fd`` can go as it is
    (a terminal, a pipe, /dev/null: the usual case costs one fstat).  ``st``:
    ``in_fd``'s fstat, when the caller has it."""
    st = st or fd_stat(in_fd)
    if st is None:
        return None
    mode = st.st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISBLK(mode) or stat.S_ISDIR(mode)):
        return None
    import fcntl

    if stat.S_ISDIR(mode) or fcntl.fcntl(in_fd, fcntl.F_GETFL) & os.O_PATH:
        # nothing to read from it anyway (EISDIR, EBADF): the command reads an end
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
    read_end, write_end = os.pipe()
    return read_end, write_end


def _plan_fds(
    plan: Plan, child_fds: dict[int, int], parent_only: list[int], to_close: list[int]
) -> int:
    """Open what the plan's numbered fds must carry; returns the status pipe's read end."""
    status_r = -1
    for number, what in plan.fds.items():
        if what == "status":
            status_r, status_w = os.pipe()
            child_fds[number] = status_w
            parent_only.append(status_r)
            to_close.append(status_w)
        elif what == "seccomp":
            from corral import seccomp

            program = seccomp.compile_filter(plan.seccomp, seccomp.native_arch())
            sec_r, sec_w = os.pipe()
            os.write(sec_w, program)  # well under a pipe's 64 KiB buffer
            os.close(sec_w)
            child_fds[number] = sec_r
            to_close.append(sec_r)
        elif what == "empty":
            null = os.open(os.devnull, os.O_RDONLY)
            child_fds[number] = null
            to_close.append(null)
        elif what.startswith("source\0"):  # a bind source, opened with no symlink followed
            from corral.tiers.namespace import open_source

            child_fds[number] = source = open_source(what)
            to_close.append(source)
        elif what == "pass":  # the caller's own descriptor of that number, asked for
            try:
                why = unpassable(number) if plan.strategy.confines else None
            except OSError:
                raise SetupError(f"--pass-fd {number}: not an open descriptor") from None
            if why is not None:  # (the CLI said so before: a caller of launch may not)
                raise SetupError(f"--pass-fd {number} {why}")
            child_fds[number] = number
    return status_r


# ioctls Python's termios module does not name (asm-generic/ioctls.h)
TIOCNXCL = 0x540D
TIOCGEXCL = 0x80045440


class TtyState:
    """What a command handed the user's terminal as stdin could change on it and
    leave changed after the run: its termios settings (``stty -echo -icanon``),
    its line discipline (TIOCSETD to n_null swallows everything written to it
    since), its exclusive mode (TIOCEXCL: no one else may open it) and its
    stopped output (TCOOFF).  Saved before the command starts, put back once
    the sandbox is gone: a normal end, a timeout, a forwarded signal."""

    def __init__(self, fd: int, attrs: list[Any], ldisc: bytes, excl: bytes | None) -> None:
        self.fd, self.attrs, self.ldisc, self.excl = fd, attrs, ldisc, excl

    @classmethod
    def save(cls, fd: int, st: os.stat_result | None) -> TtyState | None:
        """None unless ``fd`` is a terminal; a pipe or a file costs nothing more
        than the fstat the caller made, /dev/null (a memory device) neither."""
        if st is None or not stat.S_ISCHR(st.st_mode) or os.major(st.st_rdev) == 1:
            return None
        import fcntl
        import termios

        try:
            attrs = termios.tcgetattr(fd)
            ldisc = fcntl.ioctl(fd, termios.TIOCGETD, b"\0" * 4)
        except (termios.error, OSError):
            return None  # a character device that is not a terminal
        try:
            excl: bytes | None = fcntl.ioctl(fd, TIOCGEXCL, b"\0" * 4)
        except OSError:
            excl = None  # (a kernel before 3.8: not known, left alone)
        return cls(fd, attrs, ldisc, excl)

    def restore(self) -> None:
        """Put back what changed.  Only while corral's process group is the
        terminal's foreground (or the terminal is not corral's controlling
        one): a job sent to the background must not undo what the foreground
        job (an editor) set meanwhile; SIGTTOU held across, for the race."""
        import fcntl
        import termios

        fd = self.fd
        try:
            if os.tcgetpgrp(fd) != os.getpgrp():
                return
        except OSError:
            pass  # not our controlling terminal: nobody else's to protect
        held = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTTOU,))
        try:
            # the line discipline first: setting one resets the terminal's settings
            if fcntl.ioctl(fd, termios.TIOCGETD, b"\0" * 4) != self.ldisc:
                fcntl.ioctl(fd, termios.TIOCSETD, self.ldisc)
            if termios.tcgetattr(fd) != self.attrs:
                termios.tcsetattr(fd, termios.TCSANOW, self.attrs)
            if self.excl == b"\0" * 4 and fcntl.ioctl(fd, TIOCGEXCL, b"\0" * 4) != self.excl:
                fcntl.ioctl(fd, TIOCNXCL)
            termios.tcflow(fd, termios.TCOON)  # output stopped by the command: resumed
        except (termios.error, OSError):
            pass  # the terminal went away (hung up): nothing left to put back
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


class Started:
    """A plan launched in the background (a long-lived sandbox)."""

    def __init__(self, plan: Plan, pid: int, status_r: int, care: Aftercare) -> None:
        self.plan = plan
        self.pid = pid
        self.status_r = status_r
        self.care = care
        self.root = -1  # bwrap's child, once reported (see root_pidfd)

    def wait_started(self, timeout: float = 30.0) -> None:
        """Until bwrap reports its child, or raise SetupError with bwrap's words."""
        if self.status_r < 0:
            return  # no setup phase to watch (landlock, containers): the first message tells
        text = ""
        deadline = time.monotonic() + timeout
        while '"child-pid"' not in text:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.status_r], [], [], left)[0]:
                raise SetupError("the sandbox did not start in time")
            chunk = os.read(self.status_r, 65536)
            if not chunk:
                raise SetupError("the sandbox could not be set up (see its stderr)")
            text += chunk.decode("utf-8", "replace")
        self.root = root_pidfd(text)

    def stop(self) -> list[Denial]:
        """Kill the sandbox and undo what the run set up; the denials found."""
        if self.pid > 0:  # -1: already reaped (and never killpg(-1))
            self.plan.strategy.stop(self.plan, self.pid)
            kill_root(self.root)
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = -1
        if self.status_r >= 0:
            os.close(self.status_r)
            self.status_r = -1
        if self.root >= 0:
            os.close(self.root)
            self.root = -1
        return self.care.finish()


def start(plan: Plan, run_id: str, stdio: dict[int, int]) -> Started:
    """Launch ``plan`` with ``stdio`` (fd number -> our fd) and return at once."""
    care = Aftercare(plan, run_id)
    child_fds = dict(stdio)
    parent_only: list[int] = []
    to_close: list[int] = []
    try:
        status_r = _plan_fds(plan, child_fds, parent_only, to_close)
        cg = care.cg
        pid = spawn_held(plan, child_fds, cg.procs_files() if cg is not None else [], False)
    except BaseException:
        care.finish()
        raise
    finally:
        for fd in to_close:
            os.close(fd)
    care.launched(pid)
    return Started(plan, pid, status_r, care)


def _launch_and_pump(
    plan: Plan,
    result: RunResult,
    care: Aftercare,
    out_fd: int,
    err_fd: int,
    in_fd: int,
    on_output: Callable[[int, bytes], None] | None,
    asks: TerminalPrompt | None = None,
    companion: Companion | None = None,
    stdin_st: os.stat_result | None = None,
) -> None:
    if companion is not None:  # before any pipe or handler of the sandbox's exists
        companion.fork()
        companion.forked()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    parent_only = [out_r, err_r]
    to_close = [out_w, err_w]
    # stdin a file: the command gets a pipe corral fills (see stdin_feed)
    feed = stdin_feed(in_fd, stdin_st) if stdin_st is not None else None
    feed_w = -1
    if feed is not None:
        to_close.append(feed[0])
        if feed[1] >= 0:
            feed_w = feed[1]
            parent_only.append(feed_w)
    child_fds: dict[int, int] = {0: in_fd if feed is None else feed[0], 1: out_w, 2: err_w}
    status_r = _plan_fds(plan, child_fds, parent_only, to_close)

    procs_files = care.cg.procs_files() if care.cg is not None else []
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)

    resolver = plan.strategy.enter(plan)
    old_handlers = {sig: signal.signal(sig, on_signal) for sig in FORWARDED_SIGNALS}
    old_wakeup = signal.set_wakeup_fd(wake_w)
    try:
        pid = spawn_held(plan, child_fds, procs_files, True)  # after enter()
        care.launched(pid)
        for fd in to_close:
            os.close(fd)
        _pump(
            plan,
            result,
            pid,
            out_r,
            err_r,
            status_r,
            wake_r,
            received,
            out_fd,
            err_fd,
            on_output,
            resolver,
            asks,
            care,
            (in_fd, feed_w),
        )
    finally:
        if asks is not None:
            asks.close()
        if resolver is not None:
            result.lookups = resolver.refused
            resolver.close()
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        for fd in (*parent_only, wake_r, wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


def spawn_process(
    plan: Plan,
    child_fds: dict[int, int],
    procs_files: list[str],
    chdir: bool = True,
    env: dict[str, str] | None = None,
    before_exec: Callable[[], None] | None = None,
) -> int:
    """Start ``plan.argv`` with ``env`` (default ``plan.env``) in a new session; the
    building block of :meth:`LaunchStrategy.spawn`.  ``chdir``: change to
    ``plan.cwd`` first (a tool that changes directory inside itself does not
    need it); ``before_exec``: called in the child just before the exec (its
    SetupError's text goes to the child's stderr, exit 125).

    posix_spawn when nothing must happen between fork and exec; fork otherwise
    (join a cgroup, change directory, ``before_exec``)."""
    if env is None:
        env = plan.env
    if chdir or before_exec is not None:
        return _fork_exec(plan, child_fds, procs_files, env, chdir, before_exec)
    if procs_files and plan.cgroup is not None and plan.cgroup.version == "v1":
        # every run as root has a cgroup (the default limits): spawn into it
        from corral.cgroups import spawn_inside

        pid = spawn_inside(procs_files, lambda: _spawn(plan, child_fds, env))
        if pid is not None:
            return pid
    if procs_files:
        return _fork_exec(plan, child_fds, procs_files, env, False, None)
    return _spawn(plan, child_fds, env)


def _fork_exec(
    plan: Plan,
    child_fds: dict[int, int],
    procs_files: list[str],
    env: dict[str, str],
    chdir: bool,
    before_exec: Callable[[], None] | None,
) -> int:
    """Fork, join the cgroup before anything runs, arrange fds, exec."""
    pid = os.fork()
    if pid:
        return pid
    try:
        child_session(procs_files)
        move_fds_into_place(child_fds)
        try:
            os.chdir(plan.cwd)
        except OSError as exc:
            if chdir:  # (a tool that changes directory itself does it inside)
                os.write(2, f"corral: cannot enter {plan.cwd}: {exc.strerror}\n".encode())
                os._exit(126)
        if before_exec is not None:
            try:
                before_exec()
            except Exception as exc:
                # on the run's stderr pipe: _pump reports it as why setup failed
                os.write(2, f"{exc}\n".encode())
                os._exit(125)
        os.execvpe(plan.argv[0], plan.argv, env)
    except OSError as exc:
        exec_failed(plan, exc, env)
    finally:
        os._exit(125)


def spawn_held(plan: Plan, child_fds: dict[int, int], procs_files: list[str], entered: bool) -> int:
    """``plan.strategy.spawn`` with RESET_SIGNALS blocked across it, so that none
    reaches a forked child while it still has its parent's Python handlers: run
    there, corral's would note a forwarded SIGTERM in the child's copy of its
    list, and the signal was lost (a landlock reaper, which then never swept its
    command, missed about 1 in 100 SIGTERMs sent to corral as it launched).
    Blocked, a signal waits until the child has reset its handlers and lets
    them go (:func:`default_signals`); corral's own copy reaches corral's
    handler when this returns."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, RESET_SIGNALS)
    try:
        return plan.strategy.spawn(plan, child_fds, procs_files, entered)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def default_signals() -> None:
    """In a forked child: the default handling any shell would give RESET_SIGNALS,
    then those signals let go (spawn_held blocked them): one sent meanwhile
    arrives now, as for a process that had them from the start."""
    for sig in RESET_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RESET_SIGNALS)


def child_session(procs_files: list[str]) -> None:
    """In a forked child, first: the default signal handling any shell would give,
    a new session (its own process group: a timeout kills it whole) and the
    run's cgroup joined before anything of the command runs."""
    default_signals()
    os.setsid()
    for procs in procs_files:
        with open(procs, "w", encoding="utf-8") as fh:
            fh.write("0")  # ourselves (see CgroupRun.procs_files)


def exec_failed(plan: Plan, exc: OSError, env: dict[str, str]) -> None:
    """In a child whose exec failed: corral's line on its stderr, then 127 or 126."""
    from corral.failures import cannot_run

    name = plan.argv[0]
    enoent = isinstance(exc, FileNotFoundError)
    by_policy = "PATH" in plan.policy.env.set_values
    line = cannot_run(name, enoent, exc.strerror or str(exc), env.get("PATH", ""), None, by_policy)
    if "/" in name and enoent:
        line = cannot_run(name, True, "", "", os.path.exists(name))
    where = plan.strategy.cannot_run_where()
    if where != " in the sandbox":
        line = line.replace(" in the sandbox", where)
    os.write(2, (line + "\n").encode())
    os._exit(127 if enoent else 126)


def _spawn(plan: Plan, child_fds: dict[int, int], env: dict[str, str]) -> int:
    """posix_spawn (vfork underneath): cheaper than a Python fork when no cgroup must be
    joined by the child (or spawn_inside has put us in it) and the tier changes
    directory itself.  Every other descriptor open here is
    closed in the child by a file action, so only ``child_fds`` cross."""
    found = open_fds()
    if found is None:  # no /proc to list them: the fork path closes by range
        return _fork_exec(plan, child_fds, [], env, False, None)
    moves, parked = dup_moves(child_fds)
    actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, s, t) for s, t in moves]
    # after the dup2s; a closed number in the list is skipped by glibc
    closing = {*found, *parked}.difference(child_fds, (0, 1, 2))
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in sorted(closing)]
    # (the mask spawn_held set, less the signals it holds: glibc blocks every
    # signal between its fork and the exec, so none reaches a handler of ours)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ()).difference(RESET_SIGNALS)
    return os.posix_spawnp(
        plan.argv[0],
        plan.argv,
        env,
        file_actions=actions,
        setsid=True,
        setsigdef=RESET_SIGNALS,
        setsigmask=mask,
    )


def _pump(
    plan: Plan,
    result: RunResult,
    pid: int,
    out_r: int,
    err_r: int,
    status_r: int,
    wake_r: int,
    received: list[int],
    out_fd: int,
    err_fd: int,
    on_output: Callable[[int, bytes], None] | None,
    resolver: Resolver | None = None,
    asks: TerminalPrompt | None = None,
    care: Aftercare | None = None,
    feed: tuple[int, int] = (-1, -1),
) -> None:
    """Relay the sandbox's output until it is gone, then set ``result``'s exit code
    (SetupError or SetupRaced when the sandbox never started).  ``feed``: (a
    file, the command's stdin pipe to fill from it), or -1s."""
    pump = _Pump(plan, result, pid, out_fd, err_fd, on_output, resolver, asks)
    pump.care = care
    pump.watch(out_r, err_r, status_r, wake_r)
    if feed[1] >= 0:
        pump.feed(*feed)
    pump.loop(received)
    pump.finish()


class _Pump:
    """One run's output loop.  Besides relaying stdout and stderr (bounded by the
    output limit), it reads the sandbox tool's status pipe (bwrap's JSON: the
    child's pid, then the command's exit code), answers the offline resolver,
    forwards signals, enforces the timeout, and holds back stderr that may be
    the sandbox tool's own error, to say it in corral's words."""

    def __init__(
        self,
        plan: Plan,
        result: RunResult,
        pid: int,
        out_fd: int,
        err_fd: int,
        on_output: Callable[[int, bytes], None] | None,
        resolver: Resolver | None,
        asks: TerminalPrompt | None,
    ) -> None:
        self.plan, self.result, self.pid = plan, result, pid
        self.out_fd, self.err_fd = out_fd, err_fd
        self.on_output, self.resolver, self.asks = on_output, resolver, asks
        self.limit = plan.policy.limits.output
        timeout = plan.policy.limits.timeout
        self.deadline = time.monotonic() + timeout if timeout else None
        self.kept = 0  # bytes relayed so far
        self.status_text = ""
        self.status_r = -1
        self.watch_setup = False  # without a status pipe there is no setup phase
        self.started = True
        self.held_err = b""  # stderr held back until the sandbox's child exists
        self.suspect = b""  # a "bwrap: " line, until it is known to be bwrap's own or not
        self.err_tail = b""  # the last stderr bytes: where the sandbox tool's own errors land
        self.killed = False
        self.root = -1  # bwrap's child, once reported (see root_pidfd)
        self.care: Aftercare | None = None  # told the root, for its guardian
        self.stop_again_at: float | None = None  # told to stop: when to tell it again
        self.exited_at: float | None = None
        self.broken: set[int] = set()  # our own outputs whose reader went away
        self.poller = select.poll()
        self.pidfd = os.pidfd_open(pid)
        self.open_fds: dict[int, int] = {}  # pipe -> where its output goes
        self.err_r = self.wake_r = -1
        self.lookups: set[int] = set()
        self.feed_src = self.feed_w = -1  # a file, and the command's stdin pipe it fills
        self.feed_buf = b""

    def watch(self, out_r: int, err_r: int, status_r: int, wake_r: int) -> None:
        self.open_fds = {out_r: self.out_fd, err_r: self.err_fd}
        self.err_r, self.wake_r, self.status_r = err_r, wake_r, status_r
        self.watch_setup = status_r >= 0
        self.started = not self.watch_setup
        for fd in (out_r, err_r, wake_r, self.pidfd):
            self.poller.register(fd, select.POLLIN)
        if status_r >= 0:
            self.poller.register(status_r, select.POLLIN)
        if self.resolver is not None:
            self.lookups = set(self.resolver.fds())
        for fd in self.lookups:
            self.poller.register(fd, select.POLLIN)
        if self.asks is not None:
            self.asks.attach(self.poller)  # it (un)registers the terminal while a prompt is up

    def feed(self, src: int, pipe_w: int) -> None:
        self.feed_src, self.feed_w = src, pipe_w
        os.set_blocking(pipe_w, False)
        self.poller.register(pipe_w, select.POLLOUT)

    def _feed(self) -> None:
        """The command's stdin pipe has room: the next piece of the file."""
        try:
            if not self.feed_buf:
                self.feed_buf = os.read(self.feed_src, CHUNK)
            if self.feed_buf:
                self.feed_buf = self.feed_buf[os.write(self.feed_w, self.feed_buf) :]
                return
        except BlockingIOError:
            return
        except OSError:
            pass  # the command closed its stdin (EPIPE), or the file cannot be read
        # the end: the command reads EOF (dup2 over the write end, not close: the
        # number stays ours until the launcher's final cleanup closes it)
        self.poller.unregister(self.feed_w)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, self.feed_w, inheritable=False)
        os.close(null)
        self.feed_w, self.feed_buf = -1, b""

    def kill(self) -> None:
        if not self.killed:
            self.killed = True
            self.stop()

    def stop(self) -> None:
        self.stop_again_at = time.monotonic() + STOP_AGAIN
        self.plan.strategy.stop(self.plan, self.pid)
        kill_root(self.root)

    def emit(self, target: int, data: bytes) -> None:
        self.result.output_bytes += len(data)
        room = self.limit - self.kept
        if room <= 0:
            self.result.truncated = True
            return
        if len(data) > room:
            data = data[:room]
            self.result.truncated = True
        self.kept += len(data)
        if self.on_output is not None:
            self.on_output(target, data)
        elif self.asks is not None and self.asks.holds(target):
            self.asks.hold(target, data)  # after the prompt: it must not write over it
        elif not _write_all(target, data):
            self.broken.add(target)

    # -- the loop -----------------------------------------------------------------------

    def loop(self, received: list[int]) -> None:
        while self.open_fds or self.exited_at is None:
            events = self.poller.poll(self._wait_ms())
            if received and not self.killed:
                self.result.signal = received[0]
                self.kill()
            now = time.monotonic()
            late = self.deadline is not None and now >= self.deadline
            if late and not self.killed:
                self.result.timed_out = True
                self.kill()
            if self.exited_at is None and self.stop_again_at and now >= self.stop_again_at:
                self.stop()  # still there: told again
            if not events and self.exited_at is not None:
                return  # the command is gone and its pipes went quiet (a daemon kept them)
            for fd, _mask in events:
                self._ready(fd)

    def _wait_ms(self) -> float | None:
        now = time.monotonic()
        wait: float | None = None
        if self.deadline is not None:
            wait = max(0.0, self.deadline - now)
        if self.stop_again_at is not None and self.exited_at is None:
            again = max(0.0, self.stop_again_at - now)
            wait = again if wait is None else min(wait, again)
        if self.exited_at is not None:
            # Without bwrap's exit-code record, its reason for failing is still on
            # the way through stderr: wait longer for it on a busy machine.
            settled = not self.watch_setup or '"exit-code"' in self.status_text
            grace = max(0.0, self.exited_at + (EXIT_GRACE if settled else 2.0) - now)
            wait = grace if wait is None else min(wait, grace)
        return None if wait is None else wait * 1000

    def _ready(self, fd: int) -> None:
        if self.asks is not None and fd in self.asks.fds():
            self.asks.on_ready(fd)
        elif fd in self.lookups:
            assert self.resolver is not None
            self.resolver.answer(fd)
        elif fd == self.wake_r:
            os.read(self.wake_r, 512)
        elif fd == self.pidfd:
            self.exited_at = time.monotonic()
            self.poller.unregister(self.pidfd)
        elif fd == self.status_r:
            self._status()
        elif fd == self.feed_w:
            self._feed()
        else:
            self._output(fd)

    def _status(self) -> None:
        chunk = os.read(self.status_r, CHUNK)
        if not chunk:
            self.poller.unregister(self.status_r)
            self.status_r = -1
            return
        self.status_text += chunk.decode("utf-8", "replace")
        if self.root < 0 and '"child-pid"' in self.status_text:
            self.root = root_pidfd(self.status_text)
            if self.killed:  # reported after the stop: it may have outlived bwrap
                kill_root(self.root)
            elif self.care is not None and self.root >= 0:
                self.care.rooted(_status_value(self.status_text, "child-pid") or 0)
        if not self.started and _status_value(self.status_text, "child-pid") is not None:
            self.started = True
            if self.held_err.startswith(b"bwrap: "):  # the child's own setup failed
                self.suspect, self.held_err = self.held_err, b""
            elif self.held_err:
                self.emit(self.err_fd, self.held_err)
                self.held_err = b""

    def _output(self, fd: int) -> None:
        chunk = os.read(fd, CHUNK)
        if not chunk:
            self.poller.unregister(fd)
            del self.open_fds[fd]
            return
        if fd == self.err_r and not self.started:
            self.held_err += chunk[: max(0, self.limit - len(self.held_err))]
            return
        if self._held_as_suspect(fd, chunk):
            return
        self.emit(self.open_fds[fd], chunk)
        if self.open_fds[fd] in self.broken:
            # like a pipeline: the command's next write gets EPIPE/SIGPIPE (dup2
            # over the read end, not close: the number stays ours until the
            # launcher's final cleanup closes it)
            self.poller.unregister(fd)
            del self.open_fds[fd]
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, fd, inheritable=False)
            os.close(null)

    def _held_as_suspect(self, fd: int, chunk: bytes) -> bool:
        """Output after the child exists: True if ``chunk`` (on stderr) is held back
        as (part of) a line that may be bwrap's own error.  Any other output
        first releases a held line: it was the command's own."""
        err = fd == self.err_r
        if err and self.suspect and not self.suspect.endswith(b"\n"):
            # bwrap writes its message in pieces: hold the whole line
            self.suspect += chunk[: max(0, self.limit - self.kept - len(self.suspect))]
            self.err_tail = (self.err_tail + chunk)[-4096:]
            return True
        if self.suspect:  # more output: it was the command's own, pass it on
            self.emit(self.err_fd, self.suspect)
            self.suspect = b""
        if err and self.watch_setup:
            self.err_tail = (self.err_tail + chunk)[-4096:]
            if chunk.startswith(b"bwrap: "):
                # bwrap failed after reporting its child (chdir, exec): held back to
                # say it in corral's words if bwrap then exits without the
                # command's exit code
                self.suspect = chunk[: max(0, self.limit - self.kept)]
                return True
        return False

    # -- the end ------------------------------------------------------------------------

    def finish(self) -> None:
        os.close(self.pidfd)
        if self.status_r >= 0:  # collect the final exit-code record
            try:
                os.set_blocking(self.status_r, False)
                while chunk := os.read(self.status_r, CHUNK):
                    self.status_text += chunk.decode("utf-8", "replace")
            except (BlockingIOError, OSError):
                pass
        if self.exited_at is None or self.killed:
            self.kill()
        if self.root >= 0:
            os.close(self.root)
        _, wait_status = os.waitpid(self.pid, 0)
        code = _status_value(self.status_text, "exit-code")
        if self.watch_setup and code is None and not self.killed:
            code = self._without_exit_record(wait_status)
        if self.suspect:
            self.emit(self.err_fd, self.suspect)
        if self.held_err:
            self.emit(self.err_fd, self.held_err)
        if code is None:
            code = os.waitstatus_to_exitcode(wait_status)
            code = 128 - code if code < 0 else code
        code = self.plan.strategy.exit_code(self.plan, code)
        if self.result.timed_out:
            code = EXIT_TIMEOUT
        elif self.result.signal is not None:
            code = 128 + self.result.signal
        self.result.exit_code = code

    def _without_exit_record(self, wait_status: int) -> int | None:
        """bwrap reports the command's exit code only if the command ran.  Without
        that record and with bwrap's own error text, setup failed (raised), or the
        command could not be executed (127 or 126, said as a shell would)."""
        # (a failure after bwrap reported its child is held in ``suspect``; its
        # later pieces are in err_tail too: each line once)
        text = (self.held_err + self.suspect + self.err_tail).decode("utf-8", "replace")
        tool = list(dict.fromkeys(ln for ln in text.splitlines() if ln.startswith("bwrap: ")))
        plan = self.plan
        path, by_policy = plan.env.get("PATH", ""), "PATH" in plan.policy.env.set_values
        from corral.failures import execvp_failure, raced, setup_failure

        said = execvp_failure(tool[-1], path, by_policy) if tool else None
        if said is not None and all(line.startswith("bwrap: execvp ") for line in tool):
            line, code = said
            self.suspect = (line + "\n").encode()
            return code
        if not self.started or (tool and os.waitstatus_to_exitcode(wait_status) == 1):
            if not tool:
                tool = ["bwrap: " + text.strip().replace("\n", "; ")] if text.strip() else []
            error = setup_failure(plan.tier, tool)
            raise SetupRaced(error) if raced(tool) else SetupError(error)
        return None


def _write_all(fd: int, data: bytes) -> bool:
    """Write everything; False if the reader went away (a pipe's reader gone, a
    terminal hung up, or set by the command to a line discipline that takes no
    writes: n_null's EOPNOTSUPP, until the run ends and TtyState puts it back)."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BrokenPipeError:
            return False
        except OSError as exc:
            if exc.errno in (errno.EIO, errno.EOPNOTSUPP):
                return False
            raise
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        view = view[n:]
    return True
