from corral.cli import entry

entry()
