"""Every tier corral knows, in one table; modules are imported only when used."""

from __future__ import annotations

from corral.errors import RefusedError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.policy import Policy
    from corral.tiers.base import Health, Tier

# name -> (module, class).  Order is the order `corral doctor` prints.
REGISTRY: dict[str, tuple[str, str]] = {
    "microvm": ("corral.tiers.microvm", "MicroVMTier"),
    "firecracker": ("corral.tiers.planned", "FirecrackerTier"),
    "gvisor": ("corral.tiers.container", "GVisorTier"),
    "container": ("corral.tiers.container", "ContainerTier"),
    "namespace": ("corral.tiers.namespace", "NamespaceTier"),
    "landlock": ("corral.tiers.landlock", "LandlockTier"),
    "seatbelt": ("corral.tiers.planned", "SeatbeltTier"),
    "none": ("corral.tiers.none", "NoneTier"),
}

# Tiers that can run a command today, strongest first: what `auto` considers.
AUTO_ORDER = ("namespace", "landlock")


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str) -> Tier:
    try:
        module, cls = REGISTRY[name]
    except KeyError:
        from corral.errors import CorralError

        raise CorralError(f"unknown tier {name!r} (known: auto, {', '.join(REGISTRY)})") from None
    # __import__ rather than importlib: importlib.util and friends cost ~1 ms
    tier: Tier = getattr(__import__(module, fromlist=[cls]), cls)()
    return tier


def select(name: str, policy: Policy | None = None) -> tuple[Tier, Health]:
    """The tier to run on, or RefusedError with the reason.  Never a silent downgrade.
    ``policy`` carries choices some tiers check (the container tier's engine and runtime)."""
    if name != "auto":
        tier = get(name)
        health = tier.health_for(policy)
        if not health.available:
            raise RefusedError(f"tier {name} is not available here: {health.reason}")
        return tier, health
    reasons = []
    for candidate in AUTO_ORDER:
        tier = get(candidate)
        health = tier.health()
        if health.available:
            return tier, health
        reasons.append(f"{candidate}: {health.reason}")
    raise RefusedError(
        "no sandbox tier is available here (" + "; ".join(reasons) + "). "
        "corral does not fall back to running unconfined; use --tier none to do that knowingly"
    )
