"""Where the first interface commit put the host facts; they live in
:mod:`corral.tiers.base` now (no module of their own to import on every run)."""

from corral.tiers.base import HostFacts, gather_common

common = gather_common

__all__ = ["HostFacts", "common", "gather_common"]
