"""microVM building blocks (design note below, filled in as they land)."""
