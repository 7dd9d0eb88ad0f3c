"""The home layer with real tools, on every tier, as root and as a user.

Each test writes under ``~`` through a real program (npm, pip, git, a cache
writer), reads it back in a second run (the layer persists), and checks the
deny twins: the real home is byte for byte what it was, its secrets stay
unreadable, ``--home read-only`` gives today's read-only home back, an
ephemeral layer leaves nothing, and ``corral home clean`` removes the layer.

The container cases run an image built here from this host's programs with
git, node and npm, and pip added (the shared test image has none of them).
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest
from conftest import Corral, sees_host_root, wait_for

HOME_IMAGE = "localhost/corral-home-test:latest"
HOME_IMAGE_VERSION = "1"
CANARY = "CANARY-home-0b7e"


# -- helpers ---------------------------------------------------------------------------


def tree_state(root: Path) -> dict[str, tuple[object, ...]]:
    """Everything about a directory tree a write would change (not access times)."""
    out: dict[str, tuple[object, ...]] = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = os.lstat(path)
        rel = str(path.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(path))
        elif stat.S_ISREG(st.st_mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            out[rel] = ("file", st.st_mode, st.st_uid, st.st_mtime_ns, digest)
        else:
            out[rel] = ("dir", st.st_mode, st.st_uid, st.st_mtime_ns)
    return out


def put(c: Corral, path: Path, text: str, mode: int = 0o644) -> Path:
    """A file in the real test home (or the workspace), owned by the user under test."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    top = path
    while top.parent not in (c.home, c.base) and top.parent != top:
        top = top.parent
    c.chown(top)
    return path


def container(c: Corral) -> bool:
    return not sees_host_root(c)


def flags(c: Corral) -> list[str]:
    """The container cases run the home-test image (git, npm, pip); others nothing extra."""
    return ["--image", HOME_IMAGE] if container(c) else []


def run(c: Corral, ws: Path, script: str, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return c.run(["run", "-q", *flags(c), *extra, "--", "sh", "-c", script], cwd=ws, timeout=180)


def out(r: subprocess.CompletedProcess[bytes]) -> str:
    return r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")


def host_sh(c: Corral, ws: Path, script: str) -> subprocess.CompletedProcess[bytes]:
    """A shell on the host, as the user under test (the README's recipes)."""
    argv = ["sh", "-c", script]
    if c.who == "user":
        argv = ["setpriv", f"--reuid={c.uid}", f"--regid={c.gid}", "--clear-groups", "--", *argv]
    return subprocess.run(argv, cwd=ws, env=c.env(), capture_output=True, timeout=60)


def layer_of(c: Corral, ws: Path) -> Path:
    """Where ``corral home path`` says this workspace's layer is (for this tier)."""
    args = ["home", "path", *(["--container"] if container(c) else [])]
    r = c.run(args, cwd=ws)
    assert r.returncode == 0, out(r)
    return Path(r.stdout.decode().strip())


def need(c: Corral, ws: Path, program: str) -> None:
    """Skip when ``program`` does not exist in the sandbox's world (host or image)."""
    r = run(c, ws, f"command -v {program} || echo missing={program}")
    assert r.returncode == 0, out(r)  # the sandbox itself must start
    if f"missing={program}" in r.stdout.decode():
        where = "the home-test image" if container(c) else "this machine"
        pytest.skip(f"{program} is not installed in {where}")


@functools.cache
def _home_image() -> str:
    """Build HOME_IMAGE once (from this host's programs, like the shared test image,
    plus git, node, npm and pip); the reason it cannot be, or ""."""
    from corral.container.image import populate

    podman = shutil.which("podman")
    if podman is None:
        return "podman is not installed"
    have = subprocess.run(
        [
            podman,
            "image",
            "inspect",
            "--format",
            '{{index .Labels "corral.home-test"}}',
            HOME_IMAGE,
        ],
        capture_output=True,
        text=True,
    )
    if have.returncode == 0 and have.stdout.strip() == HOME_IMAGE_VERSION:
        return ""
    programs = tuple(p for p in ("python3", "curl", "git", "node") if shutil.which(p))
    with tempfile.TemporaryDirectory(prefix="corral-home-image-", dir="/var/tmp") as tmp:
        root = os.path.join(tmp, "root")
        os.makedirs(root)
        populate(root, programs)
        npm = shutil.which("npm")
        package = os.path.dirname(os.path.dirname(os.path.realpath(npm))) if npm else ""
        if package and os.path.isdir(os.path.join(package, "node_modules")):  # self-contained
            inside = "/usr/lib/node_modules/npm"
            shutil.copytree(package, root + inside, symlinks=True)
            os.symlink(inside + "/bin/npm-cli.js", os.path.join(root, "usr/bin/npm"))
        pip = subprocess.run(
            ["/usr/bin/python3", "-c", "import os, pip; print(os.path.dirname(pip.__file__))"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if pip:
            shutil.copytree(pip, root + "/usr/lib/python3/dist-packages/pip", symlinks=True)
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            [
                podman,
                "import",
                "--change",
                "CMD=/bin/sh",
                "--change",
                f"LABEL corral.home-test={HOME_IMAGE_VERSION}",
                "-",
                HOME_IMAGE,
            ],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
        )
        tar.wait()
    if imported.returncode != 0:
        return f"cannot build {HOME_IMAGE}: {imported.stderr.strip()[-300:]}"
    return ""


@pytest.fixture
def box(tsandbox: tuple[Corral, Path]) -> tuple[Corral, Path]:
    c, ws = tsandbox
    if container(c):
        why = _home_image()
        if why:
            pytest.skip(why)
    return c, ws


def tiny_tarball(ws: Path) -> Path:
    """An npm package as ``npm pack`` makes it (package/ inside a .tgz), built here."""
    files = {
        "package/package.json": '{"name": "tiny-home", "version": "1.0.0", "main": "index.js"}\n',
        "package/index.js": "module.exports = 'tiny-home works';\n",
    }
    target = ws / "tiny-home-1.0.0.tgz"
    with tarfile.open(target, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return target


def npm_app(ws: Path) -> None:
    """A package.json in ``ws`` whose one dependency is :func:`tiny_tarball`'s."""
    tiny_tarball(ws)
    (ws / "package.json").write_text(
        '{"name": "app", "version": "1.0.0", '
        '"dependencies": {"tiny-home": "file:tiny-home-1.0.0.tgz"}}\n'
    )


def tiny_wheel(ws: Path) -> Path:
    """A pure-Python wheel (PEP 427), built here: no network, no build backend."""
    target = ws / "tinyhome-1.0-py3-none-any.whl"
    files = {
        "tinyhome/__init__.py": "VALUE = 'tinyhome works'\n",
        "tinyhome-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinyhome\nVersion: 1.0\n",
        "tinyhome-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: corral-tests\n"
            "Root-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [f"{name},," for name in files] + ["tinyhome-1.0.dist-info/RECORD,,"]
    with zipfile.ZipFile(target, "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
        whl.writestr("tinyhome-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return target


# -- writes under ~ -------------------------------------------------------------------------


def test_writes_under_home_go_to_the_layer_and_persist(box: tuple[Corral, Path]) -> None:
    c, ws = box
    put(c, c.home / "notes.txt", "public-notes\n")
    before = tree_state(c.home)
    layer = layer_of(c, ws)
    # a tool that keeps a cache (python's own file calls), and a new dotfile
    write = (
        'echo "HOME=$HOME"; '
        "python3 -c \"import os; d = os.path.expanduser('~/.cache/tool'); "
        "os.makedirs(d); open(d + '/data', 'w').write('cached')\" && echo cache=ok; "
        "echo hello > ~/.toolrc && echo dotfile=ok"
    )
    r = run(c, ws, write)
    text = out(r)
    assert r.returncode == 0 and "cache=ok" in text and "dotfile=ok" in text, text
    inside_home = c.home if container(c) else layer  # containers: bound at $HOME itself
    assert f"HOME={inside_home}\n" in text, text
    r = run(c, ws, "cat ~/.cache/tool/data; echo; cat ~/.toolrc")
    assert "cached\nhello" in out(r), out(r)  # persisted: a second run sees it
    assert (layer / ".cache" / "tool" / "data").read_text() == "cached"
    assert os.stat(layer).st_mode & 0o777 == 0o700 and os.stat(layer).st_uid == c.uid
    assert tree_state(c.home) == before  # the real home: not a byte changed
    # the deny twin: without the layer, ~ is the real home and read-only, as before
    r = run(c, ws, write, "--home", "read-only")
    text = out(r)
    assert "cache=ok" not in text and "dotfile=ok" not in text, text
    assert f"HOME={c.home}\n" in text, text
    assert tree_state(c.home) == before


def test_git_config_global_persists(
    box: tuple[Corral, Path], request: pytest.FixtureRequest
) -> None:
    c, ws = box
    need(c, ws, "git")
    before = tree_state(c.home)
    r = run(c, ws, "git config --global user.name 'Sand Boxed' && echo set=ok")
    assert "set=ok" in out(r), out(r)
    r = run(c, ws, "git config --global --get user.name")
    assert r.stdout.decode() == "Sand Boxed\n", out(r)
    assert "Sand Boxed" in (layer_of(c, ws) / ".gitconfig").read_text()
    assert tree_state(c.home) == before and not (c.home / ".gitconfig").exists()
    # changing it again: git copies the existing file's mode onto its new one (chmod)
    r = run(c, ws, "git config --global user.email sb@example.org && echo again=ok")
    assert "again=ok" in out(r), out(r)  # (landlock: allowed in the home layer)


def test_real_dotfiles_are_read_through_the_layer(box: tuple[Corral, Path]) -> None:
    c, ws = box
    need(c, ws, "git")
    put(c, c.home / ".gitconfig", "[core]\n\teditor = real-editor\n")
    put(c, c.home / ".bashrc", "export FROM_BASHRC=one\n")
    put(c, c.home / ".config" / "tool" / "tool.conf", "tool-config\n")
    put(c, c.home / ".tools" / "bin" / "hello", "#!/bin/sh\necho hello-from-home\n", 0o755)
    before = tree_state(c.home)
    script = (
        "git config --global --get core.editor; cat ~/.bashrc ~/.config/tool/tool.conf; "
        "~/.tools/bin/hello; "
        "echo x > ~/.tools/bin/new 2>/dev/null "
        "&& echo through-link=WROTE || echo through-link=denied"
    )
    text = out(run(c, ws, script))
    assert tree_state(c.home) == before
    if container(c):  # the host home is not in a container: its layer starts empty
        assert "real-editor" not in text and "FROM_BASHRC" not in text, text
        return
    assert "real-editor" in text and "FROM_BASHRC=one" in text and "tool-config" in text, text
    assert "hello-from-home" in text, text  # a tool installed under ~ still runs
    assert "through-link=denied" in text, text  # a link leads to the read-only real home
    # a copy follows the real file while the sandbox has not changed it
    put(c, c.home / ".bashrc", "export FROM_BASHRC=two\n")
    before = tree_state(c.home)
    assert "FROM_BASHRC=two" in out(run(c, ws, "cat ~/.bashrc"))
    assert tree_state(c.home) == before


def test_npm_install_uses_the_layer(box: tuple[Corral, Path]) -> None:
    c, ws = box
    need(c, ws, "npm")
    npm_app(ws)
    c.chown(ws)
    before = tree_state(c.home)
    install = "npm install --offline --no-audit --no-fund --no-update-notifier && echo npm=ok"
    r = run(c, ws, install)
    assert "npm=ok" in out(r), out(r)
    assert "Unknown env config" not in out(r)  # corral sets no npm_config_ name npm lacks
    r = run(c, ws, "node -e \"console.log(require('tiny-home'))\"")
    assert "tiny-home works" in out(r), out(r)
    layer = layer_of(c, ws)
    assert (layer / ".npm" / "_cacache").is_dir()  # npm's cache went to the layer
    assert tree_state(c.home) == before
    # the deny twin: the real home read-only, npm cannot keep its cache
    shutil.rmtree(ws / "node_modules")
    r = run(c, ws, install, "--home", "read-only")
    assert "npm=ok" not in out(r), out(r)
    assert tree_state(c.home) == before


def test_pip_install_user_uses_the_layer(box: tuple[Corral, Path]) -> None:
    c, ws = box
    r = run(c, ws, "python3 -m pip --version || echo missing=pip")
    assert r.returncode == 0, out(r)  # the sandbox itself must start
    if "missing=pip" in r.stdout.decode():
        pytest.skip("pip is not installed for python3 here: " + out(r)[-200:])
    tiny_wheel(ws)
    c.chown(ws)
    before = tree_state(c.home)
    # Debian's Python marks itself externally managed (PEP 668): --user needs the flag
    install = (
        "python3 -m pip install -q --user --no-index --break-system-packages "
        "--disable-pip-version-check tinyhome-1.0-py3-none-any.whl && echo pip=ok"
    )
    r = run(c, ws, install)
    assert "pip=ok" in out(r), out(r)  # (pip chmods what it installs: in the home layer)
    r = run(c, ws, "cd / && python3 -c 'import tinyhome; print(tinyhome.VALUE, tinyhome.__file__)'")
    text = out(r)
    assert "tinyhome works" in text, text
    inside_home = c.home if container(c) else layer_of(c, ws)
    assert f"{inside_home}/.local/lib/python3" in text, text
    assert tree_state(c.home) == before
    r = run(c, ws, install, "--home", "read-only")
    assert "pip=ok" not in out(r), out(r)
    assert tree_state(c.home) == before


# -- the deny twins: secrets, ephemeral, clean ----------------------------------------------


def test_secrets_stay_masked_beneath_the_layer(box: tuple[Corral, Path]) -> None:
    c, ws = box
    for rel in (".ssh/id_ed25519", ".npmrc", ".config/gh/hosts.yml", ".aws/credentials"):
        put(c, c.home / rel, f"{CANARY} {rel}\n", 0o600)
    put(c, c.home / "notes.txt", "public\n")
    before = tree_state(c.home)
    real = c.home
    # the sandbox links to the real secrets from its own home, and writes a file of
    # its own at a path that is secret in the real home
    r = run(
        c,
        ws,
        f"ln -s {real}/.ssh/id_ed25519 ~/key; ln -s {real}/.ssh ~/sshdir; "
        f"ln -s {real}/.aws ~/.aws; "
        "echo 'registry=http://127.0.0.1:9/' > ~/.npmrc; ls -A ~; echo listed; "
        # a hard link into the layer would make a real file writable through it
        f"ln {real}/notes.txt ~/hl 2>/dev/null && echo linked=YES; "
        "echo changed >> ~/hl 2>/dev/null",
    )
    text = out(r)
    assert "listed" in text and "linked=YES" not in text, text
    for name in (".ssh", ".config/gh"):
        assert not os.path.lexists(layer_of(c, ws) / name), name  # never seeded
    script = (
        f"cat ~/key ~/sshdir/id_ed25519 ~/.aws/credentials {real}/.npmrc {real}/.ssh/id_ed25519 "
        f"~/.config/gh/hosts.yml 2>&1; echo; cat ~/.npmrc"
    )
    text = out(run(c, ws, script))
    assert CANARY not in text, text
    # allow twin: the layer's own ~/.npmrc (the sandbox's, from the last run) is readable
    assert "registry=http://127.0.0.1:9/" in text, text
    assert tree_state(c.home) == before


def test_ephemeral_home_leaves_nothing(box: tuple[Corral, Path]) -> None:
    c, ws = box
    before = tree_state(c.home)
    homes = c.state / "corral" / "homes"
    script = (
        'echo "HOME=$HOME"; cat ~/.cache/e 2>/dev/null; mkdir -p ~/.cache && echo kept > ~/.cache/e'
    )
    for _ in range(2):
        r = run(c, ws, script, "--home", "ephemeral")
        assert r.returncode == 0, out(r)
        assert "kept" not in r.stdout.decode()  # a fresh layer each run
        if not container(c):
            assert f"HOME={layer_of(c, ws)}.run-" in r.stdout.decode(), out(r)
        assert not [p.name for p in homes.iterdir() if ".run-" in p.name]  # removed after
    assert not (layer_of(c, ws) / ".cache" / "e").exists()  # the kept layer was not used
    r = run(c, ws, script)
    r = run(c, ws, script)
    assert "kept" in r.stdout.decode(), out(r)  # allow twin: persist keeps it
    assert tree_state(c.home) == before


def test_ephemeral_home_goes_when_corral_is_killed(box: tuple[Corral, Path]) -> None:
    c, ws = box
    homes = c.state / "corral" / "homes"
    argv = ["run", "-q", *flags(c), "--home", "ephemeral", "--", "sh", "-c"]
    proc = c.popen(
        [*argv, "echo data > ~/.x && echo up && sleep 60"], cwd=ws, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    assert [p for p in homes.iterdir() if ".run-" in p.name]  # there while it runs
    proc.kill()  # corral itself, SIGKILL: its guardian cleans up
    proc.wait()
    assert wait_for(lambda: not [p for p in homes.iterdir() if ".run-" in p.name], 20)


def test_home_clean_removes_the_layer(box: tuple[Corral, Path]) -> None:
    c, ws = box
    r = run(c, ws, "echo data > ~/.mine")
    assert r.returncode == 0, out(r)
    layer = layer_of(c, ws)
    assert (layer / ".mine").exists()
    listing = c.run(["home", "list"], cwd=ws).stdout.decode()
    assert f"{layer}  " in listing and f"workspace {ws}" in listing, listing
    r = c.run(["home", "clean"], cwd=ws)
    assert r.returncode == 0 and f"removed {layer}" in r.stdout.decode(), out(r)
    assert not layer.exists() and not Path(str(layer) + ".seed").exists()
    r = run(c, ws, "cat ~/.mine 2>&1; echo fresh > ~/.mine; cat ~/.mine")
    assert "data" not in r.stdout.decode() and "fresh" in r.stdout.decode(), out(r)
    other = c.base / "other-ws"
    other.mkdir()
    c.chown(other)
    assert run(c, other, "echo x > ~/.x").returncode == 0
    layer_other = layer_of(c, other)
    shutil.rmtree(other)  # a workspace that is gone: --gone removes its layer alone
    r = c.run(["home", "clean", "--gone"], cwd=ws)
    assert r.returncode == 0 and r.stdout.decode() == f"removed {layer_other}\n", out(r)
    assert not layer_other.exists() and layer.exists()
    other.mkdir()
    c.chown(other)
    assert run(c, other, "echo x > ~/.x").returncode == 0
    r = c.run(["home", "clean", "--all"], cwd=ws)
    assert r.returncode == 0 and r.stdout.decode().count("removed ") == 2, out(r)
    assert not list((c.state / "corral" / "homes").iterdir())
    r = c.run(["home", "clean", "--all", "--workspace", str(ws)], cwd=ws)
    assert r.returncode == 2 and "corral: --all and --gone are for corral home clean" in out(r)


# -- README: a token-free copy of a tool's configuration ----------------------------------------


def test_readme_recipe_token_free_npmrc_and_pip_conf(box: tuple[Corral, Path]) -> None:
    c, ws = box
    put(
        c,
        c.home / ".npmrc",
        f"registry=http://127.0.0.1:9/npm/\n//127.0.0.1:9/npm/:_authToken={CANARY}\n",
        0o600,
    )
    put(
        c, c.home / ".config" / "pip" / "pip.conf", f"[global]\nindex-url = https://u:{CANARY}@x/\n"
    )
    before = tree_state(c.home)
    # the README's recipe, run on the host as the user under test
    which = "--container" if container(c) else ""
    recipe = f"""
        set -e
        grep -v -E '_auth|_password|token' ~/.npmrc | {c.python} -m corral home put .npmrc {which}
        printf '[global]\\nindex-url = http://127.0.0.1:9/simple/\\n' \\
            | {c.python} -m corral home put .config/pip/pip.conf {which}
    """
    done = host_sh(c, ws, recipe)
    assert done.returncode == 0, done.stderr
    script = "cat ~/.npmrc ~/.config/pip/pip.conf"
    if run(c, ws, "command -v npm").returncode == 0:
        script += "; npm config get registry"
    if run(c, ws, "python3 -m pip --version").returncode == 0:
        script += "; python3 -m pip config list"
    text = out(run(c, ws, script))
    assert CANARY not in text, text
    assert "registry=http://127.0.0.1:9/npm/" in text, text
    assert "index-url = http://127.0.0.1:9/simple/" in text, text
    if "npm config get registry" in script:
        assert "\nhttp://127.0.0.1:9/npm/\n" in text, text
    if "pip config list" in script:
        assert "global.index-url='http://127.0.0.1:9/simple/'" in text, text
    # the real files stay unreadable inside
    text = out(run(c, ws, f"cat {c.home}/.npmrc {c.home}/.config/pip/pip.conf 2>&1"))
    assert CANARY not in text, text
    assert tree_state(c.home) == before


def test_home_put_follows_no_link_a_run_left_in_the_layer(box: tuple[Corral, Path]) -> None:
    """A run replaced ``~/.npmrc`` and ``~/.config/pip`` in its layer by symlinks to
    host files; the user's copy of a token-free file, written there as the README
    said, overwrote the host file (found by attacking corral).  ``corral home put``
    follows no link, on the way or at the name, and says so; the twin: once the
    links are gone, the same command writes the layer's own files."""
    c, ws = box
    which = "--container" if container(c) else ""
    precious = c.base / "precious"
    precious.write_text("ORIGINAL\n")
    c.chown(precious)
    planted = f"""
        mkdir -p ~/.config && rm -rf ~/.config/pip ~/.npmrc
        ln -s {precious} ~/.npmrc && ln -s {c.base} ~/.config/pip
    """
    assert run(c, ws, planted).returncode == 0
    put_npmrc = f"echo registry=x | {c.python} -m corral home put .npmrc {which}"
    put_pip = f"echo '[global]' | {c.python} -m corral home put .config/pip/precious {which}"
    for command in (put_npmrc, put_pip):
        refused = host_sh(c, ws, command)
        assert refused.returncode == 2 and b"symlink" in refused.stderr, refused
        assert refused.stderr.count(b"\n") == 1, refused.stderr
    assert precious.read_text() == "ORIGINAL\n"
    assert run(c, ws, "rm ~/.npmrc ~/.config/pip").returncode == 0
    for command in (put_npmrc, put_pip):
        assert host_sh(c, ws, command).returncode == 0
    assert out(run(c, ws, "cat ~/.npmrc ~/.config/pip/precious")) == "registry=x\n[global]\n"
    assert precious.read_text() == "ORIGINAL\n"


def test_home_clean_removes_a_layer_the_run_made_unwritable(box: tuple[Corral, Path]) -> None:
    """A run planted ~/.bashrc, then made its layer unwritable (chmod 500): as a
    user, `corral home clean` said "removed" and kept the plants, which the next
    run read (found by attacking corral).  Now the layer's owner gets its rights
    back and the layer goes; the twin is the plain clean above."""
    c, ws = box
    r = run(c, ws, "echo planted > ~/.bashrc && mkdir -p ~/d/e && chmod 500 ~/d/e ~/d ~")
    assert r.returncode == 0, out(r)
    layer = layer_of(c, ws)
    r = c.run(["home", "clean"], cwd=ws)
    assert r.returncode == 0 and f"removed {layer}" in r.stdout.decode(), out(r)
    assert not layer.exists()
    r = run(c, ws, "cat ~/.bashrc 2>/dev/null; echo done")
    assert "planted" not in r.stdout.decode() and "done" in r.stdout.decode(), out(r)
