"""Which tiers the shared security and behaviour tests run on, and how to ask for each.

Every entry is a *tier case*: an id that appears in test names (``[landlock-user]``)
and the CLI flags that select it.  A case is listed when its tier can run on
this machine for the user under test; a tier that cannot exist here (seatbelt
off macOS, Firecracker without its binary) is left out and says why in
:func:`absent`.  New tiers add one line to ``CASES``.
"""

from __future__ import annotations

import functools
from typing import TypedDict

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
#   host-root:   the host's / is the sandbox's root, masked where the policy says
#                (without it, containers: the image is the root; host files outside
#                the bound workspace are absent, public ones included)
HOST_ROOT = frozenset({"host-root"})


class SandboxArgs(TypedDict, total=False):
    """The keyword arguments for ``Sandbox(...)`` that select a tier case."""

    tier: str
    oci_runtime: str
    image: str


class TierCase:
    __slots__ = ("api", "flags", "id", "props", "tier")

    def __init__(
        self,
        id: str,
        tier: str,
        flags: tuple[str, ...],
        props: frozenset[str] = NAMESPACED,
        api: SandboxArgs | None = None,
    ) -> None:
        self.id = id
        self.tier = tier
        self.flags = flags  # inserted after `corral run` / `corral shell`
        self.props = props
        self.api: SandboxArgs = api or {"tier": tier}  # keyword arguments for Sandbox(...)

    def __repr__(self) -> str:
        return self.id


# The image the container cases run (built from this host's programs if missing).
TEST_IMAGE = "localhost/corral-test:latest"

# id, tier name, flags.  Container cases add their runtime flags.
CASES: tuple[TierCase, ...] = (
    TierCase("namespace", "namespace", ("--tier", "namespace"), NAMESPACED | HOST_ROOT),
    TierCase("landlock", "landlock", ("--tier", "landlock"), HOST_ROOT),
    TierCase(
        "container",
        "container",
        ("--tier", "container", "--oci-runtime", "runc", "--image", TEST_IMAGE),
        api={"tier": "container", "oci_runtime": "runc", "image": TEST_IMAGE},
    ),
    TierCase(
        "gvisor",
        "container",
        ("--tier", "container", "--oci-runtime", "runsc", "--image", TEST_IMAGE),
        api={"tier": "container", "oci_runtime": "runsc", "image": TEST_IMAGE},
    ),
)


@functools.cache
def _health(case_id: str) -> tuple[bool, str]:
    from corral import tiers

    case = next(c for c in CASES if c.id == case_id)
    try:
        tier = tiers.get(case.tier)
    except Exception as exc:  # an unknown tier in an older checkout
        return False, str(exc)
    if case.tier != "container":
        health = tier.health()
        return health.available, health.reason
    from corral.policy import Policy

    policy = Policy(".")
    policy.container.runtime = case.flags[case.flags.index("--oci-runtime") + 1]
    policy.container.image = TEST_IMAGE
    health = tier.health_for(policy)
    if not health.available:
        return False, health.reason
    return _test_image()


@functools.cache
def _test_image() -> tuple[bool, str]:
    """The container cases' image: present, or built once from this host's programs."""
    import subprocess
    import sys

    from corral.container.engine import find

    engine, why = find()
    if engine is None:
        return False, why
    from corral.container.image import IMAGE_FEATURES, IMAGE_VERSION

    have = subprocess.run(
        [
            engine.path,
            "image",
            "inspect",
            "--format",
            '{{index .Labels "corral.test-image"}} {{index .Labels "corral.test-image.features"}}',
            TEST_IMAGE,
        ],
        capture_output=True,
        text=True,
    )
    if have.returncode == 0 and have.stdout.split() == [IMAGE_VERSION, IMAGE_FEATURES]:
        return True, ""
    built = subprocess.run(
        [sys.executable, "-m", "corral.container.image", "--tag", TEST_IMAGE],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        return False, f"cannot build {TEST_IMAGE}: {built.stderr.strip()[-300:]}"
    return True, ""


def user_refusal(case: TierCase, user: str, uid: int) -> str:
    """Why ``case`` cannot run for an unprivileged ``user`` here ("" if it can)."""
    if case.tier != "container":
        return ""
    from corral.container.engine import rootless_problem

    problem = rootless_problem(user, uid)
    if problem:
        return problem
    # rootless podman keeps images per user: the root-built test image is not theirs
    return f"rootless podman has its own image store; {TEST_IMAGE} is built for root only"


def available() -> list[TierCase]:
    """The tier cases that can run here."""
    return [c for c in CASES if _health(c.id)[0]]


def absent() -> dict[str, str]:
    """Tier cases that cannot run here, with the tier's own reason."""
    return {c.id: _health(c.id)[1] for c in CASES if not _health(c.id)[0]}
