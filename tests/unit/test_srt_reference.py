"""The srt mapping checked against srt's own code: its schema and its domain matcher.

For every pattern and destination here, corral's translated rule decides as
srt's ``matchesDomainPatternWithPort`` does; every settings file corral takes
is one srt's schema takes, and every domain corral refuses for srt's reasons is
one srt's schema refuses.  Needs node and the srt package (skipped otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from corral import srt_settings
from corral.errors import PolicyError
from corral.net.rules import HostRules

PACKAGE = "node_modules/@anthropic-ai/sandbox-runtime"
CANDIDATES = [
    os.environ.get("CORRAL_SRT_PACKAGE", ""),
    str(Path.home() / ".cache/corral-bench/peers" / PACKAGE),  # python -m bench --with-peers
    "/tmp/srt/" + PACKAGE,
]


def srt_package() -> Path:
    if not shutil.which("node"):
        pytest.skip("node is not installed: srt's own code cannot run here")
    for candidate in CANDIDATES:
        if candidate and (Path(candidate) / "dist/sandbox/sandbox-config.js").exists():
            return Path(candidate)
    pytest.skip("the srt package is not installed (set CORRAL_SRT_PACKAGE to its directory)")


SCRIPT = """
const dist = process.argv[1];
const { SandboxRuntimeConfigSchema } = await import(dist + '/sandbox/sandbox-config.js');
const { matchesDomainPatternWithPort } = await import(dist + '/sandbox/domain-pattern.js');
let input = '';
for await (const chunk of process.stdin) input += chunk;
const { configs, matches } = JSON.parse(input);
console.log(JSON.stringify({
  configs: configs.map(c => SandboxRuntimeConfigSchema.safeParse(c).success),
  matches: matches.map(([p, h, port]) => matchesDomainPatternWithPort(h, port, p)),
}));
"""


def ask_srt(configs: list[object], matches: list[tuple[str, str, int]]) -> dict[str, list[bool]]:
    dist = srt_package() / "dist"
    out = subprocess.run(
        ["node", "--input-type=module", "-e", SCRIPT, str(dist)],
        input=json.dumps({"configs": configs, "matches": matches}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    answer: dict[str, list[bool]] = json.loads(out.stdout)
    return answer


PATTERNS = [
    "example.com",
    "*.example.com",
    "api.example.com:443",
    "*.example.com:8443",
    "127.0.0.1",
    "127.0.0.1:8080",
    "[::1]",
    "[::1]:9000",
    "[2001:db8::1]:443",
]
DESTINATIONS = [
    ("example.com", 443),
    ("EXAMPLE.COM", 80),
    ("a.example.com", 443),
    ("a.b.example.com", 8443),
    ("api.example.com", 443),
    ("api.example.com", 80),
    ("badexample.com", 443),
    ("example.com.evil.org", 443),
    ("127.0.0.1", 8080),
    ("127.0.0.1", 8081),
    ("::1", 9000),
    ("::1", 22),
    ("2001:db8::1", 443),
]


def test_translated_rules_decide_as_srt_matcher_does(tmp_path: Path) -> None:
    grid = [(p, h, port) for p in PATTERNS for h, port in DESTINATIONS]
    srt = ask_srt([], grid)["matches"]
    for (pattern, host, port), expected in zip(grid, srt, strict=True):
        tr = srt_settings.translate(
            {"network": {"allowedDomains": [pattern]}, "filesystem": {"allowWrite": ["."]}},
            "s.json",
            str(tmp_path),
            str(tmp_path),
        )
        got = HostRules.parse(tr.allow, tr.deny).check(host, port).allowed
        assert got is expected, f"{pattern} vs {host}:{port}: srt {expected}, corral {got}"
    assert any(srt) and not all(srt)  # the grid has both answers


def config(**network: object) -> dict[str, object]:
    return {
        "network": {"allowedDomains": [], "deniedDomains": [], **network},
        "filesystem": {"denyRead": ["~/.ssh"], "allowWrite": ["."], "denyWrite": [".env"]},
    }


ACCEPTED = [
    config(allowedDomains=PATTERNS, deniedDomains=["*", "*:22", "evil.example.com"]),
    config(strictAllowlist=True, allowLocalBinding=False, allowUnixSockets=[]),
    {**config(), "allowPty": True, "enableWeakerNestedSandbox": False, "ignoreViolations": {}},
    {**config(), "credentials": {"files": [{"path": "~/.tok", "mode": "deny"}]}},
]
SRT_REFUSES = ["*", "*.com", "a.*.example.com", "intranet", "example.com.", "https://x.org"]
SRT_REFUSES += ["example.com/p", "10.0.0.0/8", "::1", "x.org:0443", "x.org:70000", "x.org:1-9"]


def test_corral_takes_only_what_srt_takes(tmp_path: Path) -> None:
    refused = [config(allowedDomains=[entry]) for entry in SRT_REFUSES]
    answers = ask_srt([*ACCEPTED, *refused], [])["configs"]
    assert answers == [True] * len(ACCEPTED) + [False] * len(refused)
    for data in ACCEPTED:
        srt_settings.translate(data, "s.json", str(tmp_path), str(tmp_path))
    for data in refused:
        with pytest.raises(PolicyError):
            srt_settings.translate(data, "s.json", str(tmp_path), str(tmp_path))
