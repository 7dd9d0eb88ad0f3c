"""corral.linkfarm on real directories: packages hard-linked from a cache outside.

The links are made with os.link from a "cache" beside the workspace, as uv,
pnpm and bun do; tests/integration/test_filesystem.py does it with real uv.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral import linkfarm
from corral.errors import RefusedError
from corral.fsplan import plan_filesystem
from corral.policy import Policy


def put(path: Path, text: str = "x\n", cache: Path | None = None) -> None:
    """A file at ``path``: a hard link to a copy in ``cache`` (else a plain file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if cache is None:
        path.write_text(text)
        return
    source = cache / path.name
    n = 0
    while source.exists():
        n += 1
        source = cache / f"{path.name}.{n}"
    cache.mkdir(parents=True, exist_ok=True)
    source.write_text(text)
    os.link(source, path)


def venv(ws: Path, cache: Path | None, packages: int = 3) -> Path:
    site = ws / ".venv" / "lib" / "python3.11" / "site-packages"
    (ws / ".venv" / "lib64").parent.mkdir(parents=True, exist_ok=True)
    (ws / ".venv" / "lib64").symlink_to("lib")
    for n in range(packages):
        put(site / f"pkg{n}" / "__init__.py", cache=cache)
        put(site / f"pkg{n}" / "__pycache__" / "x.pyc")  # written on import: never linked
        put(site / f"pkg{n}-1.0.dist-info" / "INSTALLER")  # the installer's own
        put(site / f"pkg{n}-1.0.dist-info" / "METADATA", cache=cache)
    put(site / "single.py", cache=cache)
    put(site / "_virtualenv.pth")
    return site


def test_a_linked_environment_is_one_read_only_directory(tmp_path: Path) -> None:
    site = venv(tmp_path / "ws", tmp_path / "cache")
    assert linkfarm.find([str(tmp_path / "ws" / ".venv")]) == [str(site)]


def test_one_linked_package_among_copies_is_read_only_alone(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    site = venv(ws, None, packages=4)
    put(site / "linked" / "sub" / "mod.py", cache=tmp_path / "cache")
    put(site / "linked.py", cache=tmp_path / "cache")
    found = linkfarm.find([str(ws / ".venv")])
    assert found == sorted(found, key=found.index) and set(found) == {
        str(site / "linked"),
        str(site / "linked.py"),
    }


def test_copies_only_are_left_writable(tmp_path: Path) -> None:
    """The twin: pip, or uv with UV_LINK_MODE=copy."""
    venv(tmp_path / "ws", None)
    assert linkfarm.find([str(tmp_path / "ws" / ".venv")]) == []


def test_pnpm_store_bun_and_scoped_packages(tmp_path: Path) -> None:
    cache = tmp_path / "store"
    nm = tmp_path / "ws" / "node_modules"
    for name in ("a@1.0.0", "b@2.0.0"):
        put(nm / ".pnpm" / name / "node_modules" / name.split("@")[0] / "index.js", cache=cache)
    (nm / "a").symlink_to(".pnpm/a@1.0.0/node_modules/a")  # pnpm's top-level links
    put(nm / "plain" / "index.js")
    put(nm / "other" / "index.js")
    put(nm / "@scope" / "linked" / "index.js", cache=cache)  # bun links them in place
    put(nm / ".bin" / "tool", cache=cache)
    found = linkfarm.find([str(nm)])
    assert set(found) == {str(nm / ".pnpm"), str(nm / "@scope" / "linked")}


def test_a_package_linked_below_its_first_files_is_found(tmp_path: Path) -> None:
    site = venv(tmp_path / "ws", None, packages=2)
    put(site / "deep" / "a" / "b" / "mod.py", cache=tmp_path / "cache")
    assert linkfarm.find([str(tmp_path / "ws" / ".venv")]) == [str(site / "deep")]


def test_too_many_packages_make_the_environment_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = venv(tmp_path / "ws", tmp_path / "cache", packages=6)
    monkeypatch.setattr(linkfarm, "MAX_PACKAGES", 5)
    assert linkfarm.find([str(tmp_path / "ws" / ".venv")]) == [str(tmp_path / "ws" / ".venv")]
    monkeypatch.setattr(linkfarm, "MAX_PACKAGES", 100)
    assert linkfarm.find([str(tmp_path / "ws" / ".venv")]) == [str(site)]


def test_the_plan_binds_a_linked_environment_read_only(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    site = venv(ws, tmp_path / "cache")
    (ws / "src.py").write_text("print(1)\n")
    fs = plan_filesystem(Policy.load(workspace=str(ws)))
    assert str(site) in fs.hardlinks
    assert any(m.kind == "ro-bind" and m.dest == str(site) for m in fs.mounts)
    assert any("hard links into a cache outside the workspace" in n for n in fs.notes)
    refusing = Policy.load(workspace=str(ws))
    refusing.filesystem.hardlinks = "refuse"
    with pytest.raises(RefusedError, match='hardlinks = "refuse"'):
        plan_filesystem(refusing)


def test_the_plan_leaves_copied_environments_alone(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    site = venv(ws, None)
    fs = plan_filesystem(Policy.load(workspace=str(ws)))
    assert not any(p.startswith(str(site)) for p in fs.hardlinks)
