import gc

gc.disable()  # as scripts/corral does: corral.cli turns it back on but for `run`
from corral.cli import entry  # noqa: E402

entry()
