"""What a tier's ``plan()`` needs to know about this host, read once by the caller.

A plan is a pure function of the policy, the command and a :class:`HostFacts`
snapshot: ``Tier.gather(policy)`` reads the host (the environment, the user's
ids, whether stdin is a terminal, the unix sockets bound, the filesystem
decision that depends on which files exist, a fresh random token...) and
``Tier.plan(policy, command, ..., host=facts)`` reads nothing.  Unit tests
fabricate a snapshot instead of monkeypatching the host.

Each tier extends the snapshot with its own facts in a subclass defined in
its module (the namespace tier's bwrap path, the landlock tier's ABI, the
container tier's engine); what every tier shares is here.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from corral.cgroups import CgroupHost
    from corral.fsplan import FsPlan
    from corral.home import HomeLayer
    from corral.policy import Policy


class HostFacts:
    """A snapshot of the host for one plan.  Every field has a harmless default so
    a test names only what it cares about.

    ``environ``: corral's own environment (PATH to find tools, TMPDIR, what a
    container engine needs, what the policy passes through); ``cwd``: the
    caller's working directory, symlinks resolved ("" when it is gone); ``uid``/``gid``/``groups``:
    who corral runs as; ``stdin_tty``: whether fd 0 is a terminal; ``token``: a
    fresh random hex string naming this plan's private files and objects;
    ``python``: the interpreter a sandbox can run for corral's own helpers;
    ``fs``: the filesystem decision (:func:`corral.fsplan.plan_filesystem`,
    which reads the workspace and the secrets present); ``home``: the home
    layer, if any (:func:`corral.home.plan_home`); ``cgroups``: the host's
    cgroup layout when a limit needs one (:func:`corral.cgroups.detect`).
    """

    __slots__ = (
        "cgroups",
        "cwd",
        "environ",
        "fs",
        "gid",
        "groups",
        "home",
        "python",
        "stdin_tty",
        "token",
        "uid",
    )

    def __init__(
        self,
        *,
        environ: Mapping[str, str] | None = None,
        cwd: str = "",
        uid: int = 1000,
        gid: int = 1000,
        groups: tuple[int, ...] = (),
        stdin_tty: bool = False,
        token: str = "000000000000",
        python: str = "/usr/bin/python3",
        fs: FsPlan | None = None,
        home: HomeLayer | None = None,
        cgroups: CgroupHost | None = None,
    ) -> None:
        self.environ: dict[str, str] = dict(environ or {"PATH": "/usr/bin:/bin"})
        self.cwd = cwd
        self.uid = uid
        self.gid = gid
        self.groups = groups
        self.stdin_tty = stdin_tty
        self.token = token
        self.python = python
        self.fs = fs
        self.home = home
        self.cgroups = cgroups

    def cgroup_layout(self) -> CgroupHost:
        """The host's cgroup layout; none at all when it was not gathered (a limit
        that needs a cgroup is then refused or, for a default, not enforced)."""
        if self.cgroups is None:
            from corral.cgroups import CgroupHost

            return CgroupHost()
        return self.cgroups


def common(policy: Policy, facts: HostFacts) -> HostFacts:
    """Fill ``facts`` with what every tier reads from this host the same way; each
    tier's ``gather()`` adds the filesystem decision and its own facts."""
    from corral import cgroups

    facts.environ = dict(os.environ)
    try:
        facts.cwd = os.path.realpath(os.getcwd())
    except OSError:
        facts.cwd = ""
    facts.uid, facts.gid = os.getuid(), os.getgid()
    facts.token = os.urandom(6).hex()
    if cgroups.wanted(policy.limits):
        facts.cgroups = cgroups.detect()
    return facts
