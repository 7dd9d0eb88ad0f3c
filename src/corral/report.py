"""Every denial of a run, as data: for corral's closing lines on stderr, for
``--report``, for the activity log and for ``Sandbox.denials``.

A :class:`Denial` is one thing the policy refused or bounded, with the fields
a program needs (``to_dict``) and, when a person should hear of it after the
run, the line corral prints (``text``).  Kinds:

- ``file``: a write-deny path created and quarantined, changed and restored
  (landlock), or refused (a lock file beside it that never replaced it); a
  hard-linked file made read-only for the run;
- ``network``: a destination (or a name lookup) the proxy refused, with the
  rule, the reason, how often, and the flag that would allow it;
- ``unreachable``: a destination the policy allowed that could not be reached
  (nothing listening, a failed upstream certificate), which a client may
  report only as a reset or an empty reply;
- ``unproxied``: a name the run looked up, and the proxy allowed, that nothing
  then asked the proxy for: most likely a tool that ignores the proxy
  variables and connects directly, which the sandbox cannot (not a refusal);
- ``limit``: a limit the run hit (memory, pids, timeout, output);
- ``bound``: a default limit this host could not enforce for this user.

Nothing here imports more than ``os``: it runs after every ``corral run``.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from corral.policy import Policy
    from corral.tiers.base import Plan

# Destinations named on the one "blocked" line; the rest are counted.
BLOCKED_SHOWN = 5
# Denials of one kind listed for a run (log, report, stderr); the rest are counted
# in one more.  A run made 20,000 hard links of a secret: 23 MB in the activity
# log and as many lines on stderr (found by attacking corral).
LISTED = 100


class Denial:
    __slots__ = ("fields", "kind", "text")

    def __init__(self, kind: str, text: str = "", **fields: object) -> None:
        from corral.errors import plain

        self.kind = kind
        # the closing line on stderr ("" if said before the run); the paths and names
        # in it are the sandbox's choice: no terminal control survives in it
        self.text = plain(text)
        self.fields = fields

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, **self.fields}

    def recorded(self) -> dict[str, object]:
        """What the activity log keeps of it: :meth:`to_dict` and corral's line
        (``corral log --run ID`` prints it again)."""
        return {**self.to_dict(), "line": str(self)}

    @property
    def refused(self) -> bool:
        """Something refused (what the run record lists), not a bound or a note."""
        refusals = ("file", "network", "more")
        return self.kind in refusals and self.fields.get("action") != "read-only"

    def __str__(self) -> str:
        """corral's line for it: the one said after the run, or (a refused destination,
        which the run sums up in one ``blocked:`` line; a bound said before it) its own."""
        if self.text:
            return self.text
        f = self.fields
        if self.kind == "network":
            from corral.errors import plain

            port = f.get("port")
            dest = _dest(str(f.get("host")), port if isinstance(port, int) else None)
            return plain(f"blocked: {dest} ({_why(self, f.get('rule') == 'no-network')})")
        if self.kind == "bound":
            return f"not enforced: {f.get('name')} {f.get('value')} ({f.get('reason')})"
        return f"{self.kind}: {f}"

    def __repr__(self) -> str:
        return f"Denial({self.kind!r}, {self.fields!r})"


# -- files ------------------------------------------------------------------------


def quarantined(path: str, moved_to: str = "", error: str = "", via: str = "") -> Denial:
    """A write-deny path that did not exist at launch and was created (``via``: the
    write-deny path a symlink made during the run stood on the way to)."""
    what = (
        f"(a symlink on the way to {via}, write-deny) was created"
        if via
        else "(write-deny) was created"
    )
    extra = {"via": via} if via else {}
    return _moved(path, what, "write-deny", moved_to, error, **extra)


def new_repository(path: str, why: str, moved_to: str = "", error: str = "") -> Denial:
    """Something in a repository the run created that would run code on the host."""
    what = f"({why}, in a repository made during the run)"
    return _moved(path, what, "new-repository", moved_to, error, reason=why)


def _moved(path: str, what: str, rule: str, moved_to: str, error: str, **extra: str) -> Denial:
    """A path the quarantine took out of the workspace (or could not: ``error``)."""
    where = f"moved to {moved_to}" if moved_to else f"could not move it: {error}"
    return Denial(
        "file",
        f"denied write: {path} {what}; {where}",
        path=path,
        rule=rule,
        action="quarantined",
        moved_to=moved_to or None,
        error=error or None,
        **extra,
    )


def repositories_unchecked(limit: int) -> Denial:
    """The walk after the run stopped at its bound: a repository the run made
    beyond it was not looked at (a note, not a refusal)."""
    return Denial(
        "bound",
        f"the workspace walk after the run stopped after {limit} entries: a repository "
        "or a policy file (corral.toml) made during the run beyond them was not checked",
        name="new-repositories",
        value=limit,
        source="default",
        reason="workspace walk bound",
    )


def restored(
    path: str,
    moved_to: str = "",
    error: str = "",
    parent: str = "",
    rule: str = "write-deny",
    stays: bool = False,
) -> Denial:
    """A write-deny path or a secret changed during the run and put back (tiers without
    mounts).  ``parent``: the directory holding it was replaced, so nothing was put back;
    ``stays``: what the run left there could not be taken out (``error`` says why)."""
    if stays:
        text = f"denied write: {path} ({rule}) was changed; what the run left there could "
        text += f"not be taken out ({error}): it stays as the run left it, not restored"
    elif parent:
        text = f"denied write: {path} ({rule}) was changed, and {parent} was replaced; "
        text += "not restored"
        error = f"{parent} was replaced"
    else:
        text = f"denied write: {path} ({rule}) was changed "
        text += f"(moved to {moved_to})" if moved_to else "(removed)"
        text += (
            f"; could not restore it: {error}"
            if error
            else ("; restored from the snapshot taken at launch")
        )
    return Denial(
        "file",
        text,
        path=path,
        rule=rule,
        action="not restored" if error else "restored",
        moved_to=moved_to or None,
        error=error or None,
    )


def new_policy_file(path: str, moved_to: str = "", error: str = "") -> Denial:
    """A ``corral.toml`` the run made: what a later run started in its directory
    would have loaded as its policy."""
    what = "(a policy file, made during the run: a run started there would load it)"
    return _moved(path, what, "write-deny", moved_to, error)


def made_in_place(path: str, moved_to: str = "", error: str = "") -> Denial:
    """What the run made at an in-place path after a renamed directory carried it off."""
    what = "was made where a path the run carried off was"
    return _moved(path, what, "in-place", moved_to, error)


def carried_back(path: str, now: str, error: str = "") -> Denial:
    """An in-place path (a masked secret, a read-only write-deny path) that a directory
    renamed during the run carried to ``now``: put back at ``path`` (or ``error``)."""
    if now:
        text = f"denied write: {path} was carried to {now} by a directory the run renamed; "
        text += f"could not move it back: {error}" if error else "moved back"
    else:
        text = f"denied write: {path} was carried away by a directory the run renamed, "
        text += f"and corral could not find it: {error}"
    return Denial(
        "file",
        text,
        path=path,
        rule="in-place",
        action="not moved back" if error else "moved back",
        now=now or None,
        error=error or None,
    )


def secret_copy(secret: str, copy: str, moved_to: str = "", error: str = "") -> Denial:
    """Another name a secret's file got during the run (a rename, a hard link), taken
    out of the workspace so that no later run reads it there (``copy`` empty: the
    search could not cover every place, ``error`` says so)."""
    if not copy:
        text = f"denied read: {secret} (read-deny) was moved or linked during the run, "
        text += f"and corral could not look everywhere for it: {error}"
    else:
        where = (
            f"moved that to {moved_to}"
            if moved_to
            else f"could not take it out: {error}"
            if error
            else "removed that link"
        )
        text = f"denied read: {secret} (read-deny) was moved or linked to {copy}; {where}"
    action = "quarantined" if moved_to else "removed" if not error else "not taken out"
    return Denial(
        "file",
        text,
        path=secret,
        rule="read-deny",
        action=action if copy else "not found",
        copy=copy or None,
        moved_to=moved_to or None,
        error=error or None,
    )


def refused_write(path: str, lock: str, times: int) -> Denial:
    """A write to a read-only write-deny file that went through a lock file beside it
    (git's ``config.lock``): the lock appeared and went without replacing the file."""
    writes = f"{times} writes" if times > 1 else "a write"
    return Denial(
        "file",
        f"denied write: {path} (write-deny, read-only in the sandbox): {writes} through "
        f"{os.path.basename(lock)} refused, which git reports as 'Device or resource busy'",
        path=path,
        rule="write-deny",
        action="refused",
        lock=lock,
        count=times,
    )


def hardlinks(paths: Iterable[str]) -> list[Denial]:
    """Hard-linked files made read-only for the run (said before it, as a note)."""
    return [
        Denial("file", path=p, rule="hardlinks", action="read-only", reason="hard link")
        for p in paths
    ]


# -- network ----------------------------------------------------------------------


def _dest(host: str, port: int | None) -> str:
    if not host:  # refused before it named one (a malformed request)
        return "a request with no destination"
    if not port:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def allow_flag(entry: dict[str, object], policy: Policy) -> str:
    """The flag that would let this refused destination through ("" if none would)."""
    host, rule = str(entry.get("host") or ""), str(entry.get("rule") or "")
    port = entry.get("port") if not entry.get("lookup") else None
    number = port if isinstance(port, int) else None
    if rule == "rebinding":  # the name is allowed; its private address is not
        address = entry.get("address")
        return f"--allow {_dest(str(address), number)}" if address else ""
    if rule in policy.network.deny or (policy.network.mode == "proxy" and rule != "default"):
        return ""  # a deny rule said no, or the request itself was refused (a bad name)
    if not host:
        return ""
    flag = f"--allow {_dest(host, number)}"
    missing = [c for c in COMPANIONS.get(host, ()) if c not in policy.network.allow]
    return " ".join([flag, *(f"--allow {c}" for c in missing)])


# Hosts a tool goes on to once the first answers, named with it: otherwise each is
# found one blocked run at a time, each run paying the tool's retries (pip's five:
# found by trying corral as a new user)
COMPANIONS = {
    "pypi.org": ("files.pythonhosted.org",),  # pip: the index, then the files
    "files.pythonhosted.org": ("pypi.org",),
    "github.com": ("codeload.github.com", "objects.githubusercontent.com"),
}


def network(entries: Iterable[dict[str, object]], policy: Policy) -> list[Denial]:
    """The proxy's refusals (from the door's tally), each with its hint; most frequent
    first.  ``entries``: host, port, rule, reason, count, and ``lookup`` (a name
    lookup, no port) and ``address`` (what an allowed name resolved to) when known."""
    out = []
    for e in sorted(entries, key=lambda e: (-int(str(e.get("count") or 1)), str(e.get("host")))):
        if e.get("unreachable"):
            out.append(_unreachable(e))
            continue
        if e.get("unproxied"):
            out.append(_unproxied(e, policy))
            continue
        lookup = bool(e.get("lookup"))
        out.append(
            Denial(
                "network",
                host=e.get("host"),
                port=None if lookup else e.get("port"),
                lookup=lookup,
                rule=e.get("rule"),
                reason=e.get("reason"),
                address=e.get("address"),
                count=int(str(e.get("count") or 1)),
                allow_with=allow_flag(e, policy) or None,
            )
        )
    return out


def _unreachable(e: dict[str, object]) -> Denial:
    port = e.get("port")
    dest = _dest(str(e.get("host")), port if isinstance(port, int) else None)
    count = int(str(e.get("count") or 1))
    times = f"{count} connections, " if count > 1 else ""
    reason = str(e.get("reason") or "no reason given")
    return Denial(
        "unreachable",
        f"unreachable: {dest} ({times}allowed by {e.get('rule')}, but {reason})",
        host=e.get("host"),
        port=port,
        rule=e.get("rule"),
        reason=e.get("reason"),
        count=count,
    )


def _unproxied(e: dict[str, object], policy: Policy) -> Denial:
    host = str(e.get("host"))
    how = (
        "it may have connected directly, which the sandbox cannot"
        if policy.network.transparent
        else "a tool that ignores HTTP_PROXY (Node's fetch) connects directly, which the "
        "sandbox cannot; --transparent carries such connections to the proxy"
    )
    return Denial(
        "unproxied",
        f"note: {host} was looked up but never asked of the proxy: {how}",
        host=host,
        address=e.get("address"),
    )


def _why(d: Denial, offline: bool) -> str:
    f = d.fields
    parts = []
    count = int(str(f.get("count") or 1))
    if count > 1:
        parts.append(f"{count} {'lookups' if f.get('lookup') else 'requests'}")
    if offline:
        parts.append("no network")
    else:
        reason = str(f.get("reason") or "")
        parts.append(f"rule {f.get('rule')}" + (f": {reason}" if reason else ""))
    if f.get("allow_with"):
        # the name is allowed already: its address is needed as well, not instead
        # (read as "instead", the two hints sent a new user round in circles)
        also = "also " if f.get("rule") == "rebinding" else ""
        parts.append(f"{also}allow with {f['allow_with']}")
    return "; ".join(parts)


def blocked_line(denials: list[Denial], policy: Policy) -> str:
    """``blocked: example.org:443 (no network; allow with --allow example.org:443), ...``:
    one line for every refused destination of the run ("" if none)."""
    net = [d for d in denials if d.kind == "network"]
    if not net:
        return ""
    offline = policy.network.mode != "proxy"
    shown = []
    for d in net[:BLOCKED_SHOWN]:
        port = d.fields.get("port")
        dest = _dest(str(d.fields.get("host")), port if isinstance(port, int) else None)
        shown.append(f"{dest} ({_why(d, offline)})")
    more = len(net) - BLOCKED_SHOWN
    tail = f", and {more} more (corral run --report json lists them)" if more > 0 else ""
    if unlisted(denials, "network"):
        tail = f", and {more + unlisted(denials, 'network')} more (--report json lists {LISTED})"
    return "blocked: " + ", ".join(shown) + tail


# -- limits -----------------------------------------------------------------------


def limits(
    plan: Plan, hit: list[str], timed_out: bool, truncated: bool, output_bytes: int
) -> list[Denial]:
    """Limits the run hit, and default bounds this host did not enforce."""
    lim = plan.policy.limits
    out = []
    for name in hit:
        if name == "timeout":
            text = f"timed out after {lim.timeout:g}s; killed the whole process tree"
            out.append(Denial("limit", text, name="timeout", value=lim.timeout))
        else:
            out.append(Denial("limit", f"limit hit: {name}", name=name, value=lim.get(name)))
    if timed_out and "timeout" not in hit:
        text = f"timed out after {lim.timeout:g}s; killed the whole process tree"
        out.append(Denial("limit", text, name="timeout", value=lim.timeout))
    if truncated:
        text = f"output truncated: kept {lim.output} of {output_bytes} bytes"
        out.append(Denial("limit", text, name="output", value=lim.output, bytes=output_bytes))
    for b in plan.bounds.values():
        if b.enforced is False:  # said before the run (bounds.notice)
            out.append(Denial("bound", name=b.name, value=b.value, source=b.source, reason=b.how))
    return out


def bounded(denials: list[Denial]) -> list[Denial]:
    """``denials`` with at most LISTED of each kind, and for a kind cut short one
    more that counts the rest (what was done about each was done all the same)."""
    seen: dict[str, int] = {}
    kept = []
    for d in denials:
        seen[d.kind] = seen.get(d.kind, 0) + 1
        if seen[d.kind] <= LISTED:
            kept.append(d)
    for kind, n in seen.items():
        if n > LISTED:
            said = "" if kind == "network" else f"and {n - LISTED} more like those, not listed"
            kept.append(Denial("more", said, of=kind, count=n - LISTED))
    return kept


def unlisted(denials: list[Denial], kind: str) -> int:
    """How many denials of ``kind`` :func:`bounded` left out."""
    return sum(
        int(str(d.fields["count"]))
        for d in denials
        if d.kind == "more" and d.fields.get("of") == kind
    )


def document(run_id: str, tier: str, exit_code: int, denials: list[Denial]) -> dict[str, object]:
    """What ``--report`` writes."""
    return {
        "run_id": run_id,
        "tier": tier,
        "exit": exit_code,
        "denials": [d.to_dict() for d in denials],
    }
