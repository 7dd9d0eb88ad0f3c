"""Repositories a run created: what in them would run code outside the sandbox.

At launch every git dir in the workspace gets its hooks and config made
read-only (:mod:`corral.fsplan`).  A repository the command creates during the
run (``git init``, a clone, a new submodule or worktree, a ``.git`` file or
symlink pointing somewhere) is not covered by that, and what it holds runs on
the host the next time anyone uses git there: a hook, or a config key such as
``core.fsmonitor``, ``core.pager`` or an ``alias.*`` beginning with ``!``.

After the run, the workspace and every other writable root are walked again
(the same bounded walk) and every
git dir or ``.git`` entry not there at launch (by inode) is looked at:

* ``hooks/``: everything but the ``*.sample`` files ``git init`` writes;
* ``config`` when it sets any key outside :data:`SAFE_KEYS` (or cannot be read
  plainly): the keys git writes itself for init, clone, remotes, branches and
  identity.  Unknown means unsafe;
* ``config.worktree`` and ``commondir`` (unless it names a git dir known at
  launch): what a linked worktree reads;
* a ``.git`` file or symlink leading out of the workspace to a directory not
  known at launch.

Each is moved to the quarantine (as a created write-deny path is) and named
after the run.  Only paths inside the roots walked are ever moved.
"""

from __future__ import annotations

import os

from corral import fsplan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from corral.report import Denial

# "section.key" for sections without a subsection, "section.*.key" with one.
SAFE_KEYS = frozenset(
    {
        "core.repositoryformatversion",
        "core.filemode",
        "core.bare",
        "core.logallrefupdates",
        "core.ignorecase",
        "core.precomposeunicode",
        "core.symlinks",
        "core.worktree",  # a submodule's git dir names its working tree
        "init.defaultbranch",
        "extensions.objectformat",
        "user.name",
        "user.email",
        "remote.*.url",
        "remote.*.pushurl",
        "remote.*.fetch",
        "branch.*.remote",
        "branch.*.merge",
        "submodule.*.url",
        "submodule.*.active",
    }
)
HOOKS_KEPT = ".sample"  # git's own examples: never run


def unsafe_config_key(text: str) -> str | None:
    """The first key of a git config that is not in SAFE_KEYS (or a line this
    reader cannot take plainly, such as a continued value); None when all are safe."""
    for section, key, _ in fsplan.git_config(text):
        if section == fsplan.MALFORMED:
            return key
        name = f"{section}.{key}"
        if not section or name not in SAFE_KEYS:
            return name
    return None


def risky_parts(
    git_dir: str, known: frozenset[tuple[int, int]], templates: list[str] | None = None
) -> list[tuple[str, str]]:
    """(path, why) for what in a new git dir would run code on the host
    (``templates``: git's template directories the run could not write)."""
    templates = template_dirs() if templates is None else templates
    found: list[tuple[str, str]] = []
    hooks = os.path.join(git_dir, "hooks")
    if os.path.islink(hooks):
        found.append((hooks, "a hooks directory that is a symlink"))
    else:
        try:
            names = sorted(os.listdir(hooks))
        except OSError:
            names = []
        found += [
            (os.path.join(hooks, n), "a git hook")
            for n in names
            if not n.endswith(HOOKS_KEPT)
            and not _from_template(os.path.join(hooks, n), n, templates)
        ]
    config = os.path.join(git_dir, "config")
    if os.path.lexists(config):
        why = _config_problem(config)
        if why is not None:
            found.append((config, why))
    worktree = os.path.join(git_dir, "config.worktree")
    if os.path.lexists(worktree):
        found.append((worktree, "a worktree's git config"))
    common = os.path.join(git_dir, "commondir")
    if (
        os.path.lexists(common)
        and fsplan.identity(_commondir(git_dir, common), follow=True) not in known
    ):
        found.append((common, "a worktree's common dir that is not a repository known at launch"))
    return found


def template_dirs(environ: dict[str, str] | None = None) -> list[str]:
    """Where git copies a new repository's hooks from: ``$GIT_TEMPLATE_DIR``, the
    user's and the system's ``init.templateDir``, git's own default."""
    env = os.environ if environ is None else environ
    found = [env["GIT_TEMPLATE_DIR"]] if env.get("GIT_TEMPLATE_DIR") else []
    home = env.get("HOME") or os.path.expanduser("~")
    xdg = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    for config in (os.path.join(home, ".gitconfig"), os.path.join(xdg, "git", "config")):
        found += _template_setting(fsplan.read_small(config) or "", home)
    found += _template_setting(fsplan.read_small("/etc/gitconfig") or "", home)
    return [*found, "/usr/share/git-core/templates"]


def _template_setting(text: str, home: str) -> list[str]:
    found = []
    for section, key, value in fsplan.git_config(text):
        if section == "init" and key == "templatedir":
            found.append(home + value[1:] if value.startswith("~/") else value)
    return found


def _from_template(path: str, name: str, templates: list[str]) -> bool:
    """Whether a hook is one git copied from a template directory of the user's (the
    same name and bytes): the user's own, not the command's."""
    data = fsplan.read_small_bytes(path)
    if data is None:
        return False
    for directory in templates:
        if fsplan.read_small_bytes(os.path.join(directory, "hooks", name)) == data:
            return True
    return False


def _config_problem(path: str) -> str | None:
    if os.path.islink(path):
        return "a git config that is a symlink"
    text = fsplan.read_small(path)
    if text is None or "\ufffd" in text:
        return "a git config that is not a plain text file"
    key = unsafe_config_key(text)
    return None if key is None else f"git config sets {key}"


def _commondir(git_dir: str, common: str) -> str:
    target = (fsplan.read_small(common, 4096) or "").partition("\n")[0].strip()
    return os.path.realpath(os.path.join(git_dir, target)) if target else ""


def findings(
    roots: str | Sequence[str], scan: fsplan.WorkspaceScan, known: frozenset[tuple[int, int]]
) -> list[tuple[str, str]]:
    """(path, why) to quarantine, from a walk made after the run of ``roots`` (the
    workspace, or every writable root walked: fsplan.walk_roots)."""
    inside = tuple(r.rstrip("/") + "/" for r in ([roots] if isinstance(roots, str) else roots))
    found: list[tuple[str, str]] = []
    for entry in scan.git_files:
        if fsplan.identity(entry) in known:
            continue
        if os.path.islink(entry):
            target = os.path.realpath(entry)
        else:
            target = fsplan.gitfile_target(entry) or ""
        # one inside is a git dir of this walk, looked at below
        if not target:
            found.append((entry, "a .git entry that is neither a directory nor a gitdir file"))
        elif not target.startswith(inside) and fsplan.identity(target, follow=True) not in known:
            found.append((entry, "a .git entry leading out of the workspace"))
    # a template the run could write (one in the workspace) vouches for nothing
    templates = [d for d in template_dirs() if not os.path.realpath(d).startswith(inside)]
    for git_dir in scan.git_dirs:
        if git_dir.startswith(inside) and fsplan.identity(git_dir) not in known:
            found += risky_parts(git_dir, known, templates)
    return [(p, why) for p, why in found if p.startswith(inside)]


def quarantine(found: list[tuple[str, str]], run_id: str) -> list[Denial]:
    """Move each finding out of the workspace; the denials to report.  (A directory on
    the way that another sandbox made a symlink since the walk is refused by
    :func:`corral.quarantine.move_out`, never followed.)"""
    from corral.quarantine import move_out
    from corral.report import new_repository

    said = []
    for path, why in found:
        dest, error = move_out(path, run_id)
        said.append(new_repository(path, why, dest, error))
    return said
