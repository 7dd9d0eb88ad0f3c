# Shortcuts for the commands in README.md; each is one line you can also run by hand.
PY ?= .venv/bin/python

.PHONY: test bench bench-quick conformance

test:
	$(PY) -m pytest -q

# Every benchmark and the peers (srt, codex: installed on first use into ~/.cache/corral-bench).
bench:
	$(PY) -m bench --with-peers

bench-quick:
	$(PY) -m bench --quick --with-peers

# The security conformance matrix, tiers x cases, also in bench/results/conformance.md.
conformance:
	$(PY) -m bench.conformance
