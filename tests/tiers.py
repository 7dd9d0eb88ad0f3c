"""Which tiers the shared security and behaviour tests run on, and how to ask for each.

Every entry is a *tier case*: an id that appears in test names (``[landlock-user]``)
and the CLI flags that select it.  A case is listed when its tier can run on
this machine for the user under test; a tier that cannot exist here (seatbelt
off macOS, Firecracker without its binary) is left out and says why in
:func:`absent`.  New tiers add one line to ``CASES``.
"""

from __future__ import annotations

import functools

# How a tier isolates, where tiers differ by design (tests assert the mechanism
# each tier has; none of them may be weaker than the tier documents):
#   mounts:      masks and read-only binds; a write-deny path cannot be written at all
#                (without it: written, then restored after the run and reported)
#   private-tmp: its own /tmp (without it: /tmp is off limits and TMPDIR is private)
#   own-dev:     a minimal /dev (without it: host devices listed but not openable)
#   pidns:       host processes invisible (without it: visible, not reachable)
#   uts:         its own hostname
#   netns:       its own loopback; ports can be bound inside
NAMESPACED = frozenset({"mounts", "private-tmp", "own-dev", "pidns", "uts", "netns"})


class TierCase:
    __slots__ = ("api", "flags", "id", "props", "tier")

    def __init__(
        self,
        id: str,
        tier: str,
        flags: tuple[str, ...],
        props: frozenset[str] = NAMESPACED,
        api: dict[str, str] | None = None,
    ) -> None:
        self.id = id
        self.tier = tier
        self.flags = flags  # inserted after `corral run` / `corral shell`
        self.props = props
        self.api = api or {"tier": tier}  # keyword arguments for Sandbox(...)

    def __repr__(self) -> str:
        return self.id


# id, tier name, flags.  Container cases add their runtime flags.
CASES: tuple[TierCase, ...] = (
    TierCase("namespace", "namespace", ("--tier", "namespace")),
    TierCase("landlock", "landlock", ("--tier", "landlock"), frozenset()),
    TierCase("container", "container", ("--tier", "container", "--oci-runtime", "runc")),
    TierCase("gvisor", "container", ("--tier", "container", "--oci-runtime", "runsc")),
)


@functools.cache
def _health(case_id: str) -> tuple[bool, str]:
    from corral import tiers

    case = next(c for c in CASES if c.id == case_id)
    try:
        tier = tiers.get(case.tier)
    except Exception as exc:  # an unknown tier in an older checkout
        return False, str(exc)
    health = tier.health()
    return health.available, health.reason


def available() -> list[TierCase]:
    """The tier cases that can run here."""
    return [c for c in CASES if _health(c.id)[0]]


def absent() -> dict[str, str]:
    """Tier cases that cannot run here, with the tier's own reason."""
    return {c.id: _health(c.id)[1] for c in CASES if not _health(c.id)[0]}
