"""The microvm tier on a real guest: QEMU ``-M microvm``, Debian's kernel, corral's
initramfs, the host's view over 9p, through ``corral run --tier microvm``.

As root and as an unprivileged user.  Each test boots a guest (2 to 5 s under
TCG), so all but a quick few are marked slow.  Evidence is taken on the host:
files that landed or did not, QEMU processes left or not, requests an origin
received.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import pty
import shlex
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest
from conftest import ROOT_BASE, Corral, pids_matching, wait_for
from test_home import npm_app, put, tiny_wheel, tree_state
from test_network import Origin
from test_shell import read_until

from corral.vm import setup
from tests.tls_origin import Origin as TlsOrigin
from tests.tls_origin import OriginCA

SECRET = "vm-secret-4e1b9c"
PUBLIC = "vm-public-77a0d2"
CURL = "curl -sS --noproxy '' --max-time 20"


def _why_not() -> str:
    from corral.errors import CorralError
    from corral.vm import run

    if not setup.installed(setup.SYSTEM_DIR):
        return f"no guest kernel in {setup.SYSTEM_DIR} (run: {setup.setup_command()} --system)"
    try:
        run.requirements()
    except CorralError as exc:
        return exc.message
    return ""


WHY_NOT = _why_not()
if WHY_NOT:
    pytest.skip(f"microvm cannot run here: {WHY_NOT}", allow_module_level=True)


def cache_for(c: Corral) -> str:
    """One cache per user for the whole session: the initramfs is built and the
    accelerator probed once, not per test."""
    base = ROOT_BASE if os.geteuid() == 0 else Path.home()
    path = base / f"vm-cache-{c.who}"
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, c.uid, c.gid)
    return str(path)


def tmp_for(c: Corral, ws: Path) -> str:
    """corral's own TMPDIR for one test (its door's directory lands there): what a
    run leaves is told apart from what neighbouring runs of the same user make."""
    path = ws.parent / "corral-tmp"
    if not path.exists():
        path.mkdir()
        os.chown(path, c.uid, c.gid)
    return str(path)


def vm_env(c: Corral, ws: Path) -> dict[str, str]:
    return c.env({"XDG_CACHE_HOME": cache_for(c), "TMPDIR": tmp_for(c, ws)})


def vm_argv(c: Corral, args: list[str]) -> list[str]:
    return c.python_argv(["-P", "-m", "corral", "run", "--tier", "microvm", "-q", *args])


def vm(
    c: Corral, ws: Path, *args: str, timeout: float = 180, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        vm_argv(c, list(args)),
        cwd=ws,
        env=vm_env(c, ws),
        capture_output=True,
        timeout=timeout,
        input=stdin if stdin is not None else b"",
    )


def vm_popen(c: Corral, ws: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        vm_argv(c, list(args)),
        cwd=ws,
        env=vm_env(c, ws),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def qemus_of(runner_pid: int) -> list[int]:
    """QEMU (or its bubblewrap) started by this corral: it names the VM after its pid."""
    return pids_matching(f"qemu-system-x86_64 -name corral-vm-{runner_pid}-")


def test_exit_code_and_separate_output(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    r = vm(c, ws, "--", "sh", "-c", "cat; echo out; echo err >&2; exit 7", stdin=b"in\n")
    assert (r.returncode, r.stdout, r.stderr) == (7, b"in\nout\n", b"err\n")
    killed = vm(c, ws, "--", "sh", "-c", "echo before; kill -TERM $$; echo after")
    assert (killed.returncode, killed.stdout, killed.stderr) == (
        128 + signal.SIGTERM,
        b"before\n",
        b"",
    )


def test_corral_shell_runs_on_the_guests_own_terminal(sandbox: tuple[Corral, Path]) -> None:
    """corral shell: the guest makes the pty (corral.shell.TTY_RELAY), corral's own
    pty only carries bytes; the window size, a resize, job control's terminal, the
    exit code, and the sandbox's bounds inside the shell."""
    c, ws = sandbox
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 31, 101, 0, 0))
    os.chown(os.ttyname(slave), c.uid, c.gid)

    def own_terminal() -> None:  # corral's terminal is its ctty: it gets SIGWINCH
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    argv = c.python_argv(
        ["-P", "-m", "corral", "shell", "--tier", "microvm", "-q", "--", "sh", "-i"]
    )
    proc = subprocess.Popen(
        argv, cwd=ws, env=vm_env(c, ws), stdin=slave, stdout=slave, stderr=slave,
        preexec_fn=own_terminal,
    )  # fmt: skip
    os.close(slave)
    prompt = b"$ " if c.who == "user" else b"# "
    try:
        assert read_until(master, prompt, 60).endswith(prompt)
        os.write(master, b"echo A$((6*7))B; stty size; tty; echo x > made-in-shell\n")
        out = read_until(master, b"/dev/pts/")
        assert b"A42B" in out and b"31 101" in out, out  # the size crossed into the guest
        read_until(master, prompt)
        os.write(master, b"touch /usr/corral-shell-test || echo usr-refused\n")
        assert b"usr-refused" in read_until(master, b"usr-refused")  # the twin: bounds hold
        read_until(master, prompt)
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        out = b""
        for _ in range(20):  # corral shell's resize, framed through to the guest's pty
            time.sleep(0.25)
            os.write(master, b"stty size\n")
            out += read_until(master, prompt, 2)
            if b"40 120" in out:
                break
        assert b"40 120" in out, out
        os.write(master, b"exit 3\n")
        assert proc.wait(timeout=30) == 3
    finally:
        proc.kill()
        os.close(master)
    assert (ws / "made-in-shell").read_text() == "x\n"
    assert not Path("/usr/corral-shell-test").exists()
    missing = subprocess.run(
        c.python_argv(
            ["-P", "-m", "corral", "shell", "--tier", "microvm", "-q", "--", "no-such-sh"]
        ),
        cwd=ws, env=vm_env(c, ws), capture_output=True, input=b"", timeout=120,
    )  # fmt: skip
    assert missing.returncode == 127, missing
    assert b"corral: no-such-sh: command not found in the sandbox" in missing.stdout
    records = [json.loads(x) for x in c.run(["log", "--json"], cwd=ws).stdout.splitlines()]
    assert [(x["kind"], x["argv"], x["exit"]) for x in records[-2:]] == [
        ("shell", ["sh", "-i"], 3),
        ("shell", ["no-such-sh"], 127),
    ]


def test_writes_under_home_go_to_the_layer_and_persist(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    put(c, c.home / ".bashrc", "export FROM_BASHRC=one\n")
    put(c, c.home / ".ssh" / "id_ed25519", SECRET + "\n", 0o600)
    before = tree_state(c.home)
    layer = Path(c.run(["home", "path"], cwd=ws).stdout.decode().strip())
    write = (
        'echo "HOME=$HOME"; mkdir -p ~/.cache/tool && echo cached > ~/.cache/tool/data '
        "&& echo cache=ok; git config --global user.name 'Sand Boxed' && echo git=ok; "
        f"cat ~/.bashrc; cat ~/.ssh/id_ed25519 {c.home}/.ssh/id_ed25519 2>&1; "
        f"echo x > {c.home}/real.txt || echo real=refused"
    )
    r = vm(c, ws, "--", "sh", "-c", write)
    text = r.stdout.decode() + r.stderr.decode()
    assert f"HOME={layer}\n" in text and "cache=ok" in text and "git=ok" in text, text
    assert "FROM_BASHRC=one" in text  # the real dotfile, seeded into the layer
    assert SECRET not in text and "real=refused" in text  # masked, and read-only beneath
    r = vm(c, ws, "--", "sh", "-c", "cat ~/.cache/tool/data; git config --global user.name")
    assert r.stdout.decode() == "cached\nSand Boxed\n", r.stderr  # persisted on the host
    assert (layer / ".cache" / "tool" / "data").read_text() == "cached\n"
    assert tree_state(c.home) == before  # the real home: not a byte changed
    # the deny twin: without the layer, ~ is the real home and read-only, as before
    r = vm(c, ws, "--home", "read-only", "--", "sh", "-c", write)
    text = r.stdout.decode() + r.stderr.decode()
    assert f"HOME={c.home}\n" in text and "cache=ok" not in text and "git=ok" not in text, text
    assert tree_state(c.home) == before


@pytest.mark.slow
def test_npm_install_and_pip_install_user_use_the_layer(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    npm_app(ws)
    tiny_wheel(ws)
    c.chown(ws)
    before = tree_state(c.home)
    npm = "npm install --offline --no-audit --no-fund --no-update-notifier && echo npm=ok"
    pip = (
        "python3 -m pip install -q --user --no-index --break-system-packages "
        "--disable-pip-version-check tinyhome-1.0-py3-none-any.whl && echo pip=ok"
    )
    script = (
        f"if command -v npm >/dev/null; then {npm}; else echo npm=missing; fi; "
        f"if python3 -m pip --version >/dev/null 2>&1; then {pip}; else echo pip=missing; fi"
    )
    r = vm(c, ws, "--", "sh", "-c", script)
    text = r.stdout.decode() + r.stderr.decode()
    if "npm=missing" in text and "pip=missing" in text:
        pytest.skip("neither npm nor pip is installed on this machine")
    layer = Path(c.run(["home", "path"], cwd=ws).stdout.decode().strip())
    if "npm=missing" not in text:
        assert "npm=ok" in text, text
        assert (layer / ".npm" / "_cacache").is_dir()  # npm's cache went to the layer
    if "pip=missing" not in text:
        assert "pip=ok" in text, text
        r = vm(
            c, ws, "--", "sh", "-c", "cd / && python3 -c 'import tinyhome; print(tinyhome.VALUE)'"
        )
        assert r.stdout.decode() == "tinyhome works\n", r.stderr
    assert tree_state(c.home) == before


@pytest.mark.slow
def test_workspace_writes_land_and_writes_outside_fail(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    script = f"""
        echo landed > inside.txt && echo inside-ok
        echo x > {c.home}/outside.txt || echo home-refused
        touch /usr/corral-vm-test || echo usr-refused
        id -u
    """
    r = vm(c, ws, "--", "sh", "-c", script)
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr
    assert (ws / "inside.txt").read_text() == "landed\n" and "inside-ok" in out  # allow twin
    assert (ws / "inside.txt").stat().st_uid == c.uid  # the caller's file, as on other tiers
    assert "home-refused" in out and not (c.home / "outside.txt").exists()
    assert "usr-refused" in out and not Path("/usr/corral-vm-test").exists()
    assert out.split()[-1] == str(c.uid)


def test_the_guest_leaves_no_set_id_program(sandbox: tuple[Corral, Path]) -> None:
    """The guest's root may set any mode inside the guest, but its writes to the
    workspace are made on the host by QEMU, under corral's syscall filter: no
    set-ID bit lands there.  Twin: a plain mode does."""
    from test_escapes import SET_ID_PROBE, set_id_files

    c, ws = sandbox
    r = vm(c, ws, "--", "python3", "-c", SET_ID_PROBE)
    out = r.stdout.decode()
    assert r.returncode == 0, r
    for what in ("chmod-suid", "chmod-sgid", "fchmod-suid", "create-suid", "mknod-suid"):
        assert f"{what}=err:" in out, (what, out)
    assert set_id_files(ws) == {} and not (ws / "made").exists()
    assert "chmod-plain=ok" in out and (ws / "prog").stat().st_mode & 0o7777 == 0o755, out


MODULE_PROBE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def load(path):  # finit_module(2): x86-64 number 313
    fd = os.open(path, os.O_RDONLY)
    ok = libc.syscall(313, fd, b"", 0) == 0
    return "loaded" if ok else os.strerror(ctypes.get_errno())
signed = sys.argv[1]
data = open(signed, "rb").read()
magic = b"~Module signature appended~\\n"
size = int.from_bytes(data[-len(magic) - 4 : -len(magic)], "big")
with open("unsigned.ko", "wb") as fh:
    fh.write(data[: -len(magic) - 12 - size])
print("signed:", load(signed))
print("unsigned:", load("unsigned.ko"))
"""


def test_the_guests_root_loads_no_unsigned_module(sandbox: tuple[Corral, Path]) -> None:
    """The guest kernel is locked down: even its root cannot load a module without
    Debian's signature.  Twin: the same module signed passes the check (and is
    then found already loaded)."""
    c, ws = sandbox
    if c.who != "root":
        pytest.skip("loading a module needs the guest's root (corral run as root)")
    (assets,) = setup.installed(setup.SYSTEM_DIR)[:1]
    r = vm(c, ws, "--", "python3", "-c", MODULE_PROBE, assets.module_path("virtio"))
    assert r.returncode == 0, r
    assert r.stdout.decode().splitlines() == [
        "signed: File exists",
        "unsigned: Operation not permitted",
    ]


# The guest's root writes its own line on the init's control port (fd 3 of pid 1,
# taken with pidfd_getfd), then waits to be stopped.
FORGE_REPORT = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
port = libc.syscall(438, os.pidfd_open(1), 3, 0)  # pidfd_getfd(2)
if port < 0:
    sys.exit(f"pidfd_getfd: {os.strerror(ctypes.get_errno())}")
os.write(port, sys.argv[1].encode() + b"\\n")
time.sleep(60)
"""


def test_a_forged_report_is_refused_not_obeyed(sandbox: tuple[Corral, Path]) -> None:
    """The guest's root can write any line on the control port: an exit status no
    process can have (past 255, or digits Python reads but no shell writes) is
    refused in one line, never carried into corral's own exit, where it made the
    runner's os._exit raise and its fork run on as a second corral.  Twin: a
    command's own status passes."""
    c, ws = sandbox
    if c.who != "root":
        pytest.skip("writing on the control port needs the guest's root (corral run as root)")
    for line in ("exit 4294967296 0 0 0", "exit \u00b2 0 0 0"):
        r = vm(c, ws, "--", "python3", "-c", FORGE_REPORT, line)
        err = r.stderr.decode()
        assert r.returncode == 125, (line, r)
        assert err.startswith("corral: microvm: the guest answered") and err.count("\n") == 1, err
    assert vm(c, ws, "--", "sh", "-c", "exit 200").returncode == 200


def test_corrals_vm_cache_is_out_of_reach_under_a_writable_path(
    sandbox: tuple[Corral, Path],
) -> None:
    """A run granted a directory that holds corral's VM cache (``--writable
    ~/.cache``, for a tool's cache) must not rewrite the initramfs or the saved
    states there: every later microvm run would boot or restore what it left.
    Twin: the rest of that directory is writable.  (A cache of this test's own,
    filled from the session's: a failure must not leave the session's tampered.)"""
    c, ws = sandbox
    own = ws.parent / "own-cache"
    vm_dir = own / "corral" / "vm"
    vm_dir.mkdir(parents=True)
    for entry in Path(cache_for(c), "corral", "vm").glob("*"):
        if entry.name.startswith(("initramfs-", "accel-")) and ".tmp" not in entry.name:
            (vm_dir / entry.name).write_bytes(entry.read_bytes())
    c.chown(own, own / "corral", vm_dir, *vm_dir.iterdir())
    env = {**vm_env(c, ws), "XDG_CACHE_HOME": str(own)}
    image = next(vm_dir.glob("initramfs-*.cpio"))
    before = image.read_bytes()
    script = f"""
        echo tampered > {shlex.quote(str(image))} || echo image-refused
        echo x > {vm_dir}/state-planted || echo state-refused
        mv {own}/corral {own}/moved 2>/dev/null || echo rename-refused
        echo tool > {own}/tool-cache.txt && echo tool-ok
    """
    argv = vm_argv(c, ["--writable", str(own), "--", "sh", "-c", script])
    r = subprocess.run(argv, cwd=ws, env=env, capture_output=True, timeout=180, input=b"")
    out = r.stdout.decode()
    assert "image-refused" in out and "state-refused" in out, (out, r.stderr)
    assert "rename-refused" in out and vm_dir.is_dir(), out  # no planted one in its place
    assert image.read_bytes() == before and not (vm_dir / "state-planted").exists()
    assert "tool-ok" in out and (own / "tool-cache.txt").read_text() == "tool\n"


@pytest.mark.slow
def test_secrets_stay_absent_even_for_the_guests_root(sandbox: tuple[Corral, Path]) -> None:
    """The masks are on the host side of 9p, not mounts in the guest: there is
    nothing for the guest's root to unmount, and what it asks QEMU for behind a
    mask is refused by the host (or is an empty file), chmod and rename included."""
    c, ws = sandbox
    ssh = c.home / ".ssh"
    ssh.mkdir()
    (ssh / "id_ed25519").write_text(SECRET)
    (c.home / "notes.txt").write_text(PUBLIC)
    (ws / ".env").write_text(f"TOKEN={SECRET}\n")  # a secret inside the writable workspace
    c.chown(ssh, c.home / "notes.txt", ws / ".env")
    script = f"""
        id -u
        cat "$HOME/.ssh/id_ed25519" || echo read-refused
        chmod 644 "$HOME/.ssh" "$HOME/.ssh/id_ed25519" || echo chmod-refused
        cat .env || echo env-refused
        chmod 644 .env || echo env-chmod-refused
        mv .env moved || echo env-rename-refused
        rm -f .env || echo env-remove-refused
        grep -c -e " $HOME/.ssh " -e " $PWD/.env " /proc/mounts || echo no-guest-mount
        cat "$HOME/notes.txt"
        grep -r {SECRET} "$HOME" . 2>/dev/null || echo not-found
    """
    r = vm(c, ws, "--", "sh", "-c", script)
    out = r.stdout.decode()
    assert out, r.stderr
    assert out.split()[0] == ("0" if c.who == "root" else str(c.uid))  # root: the guest's root
    assert SECRET not in out + r.stderr.decode()
    for refused in ("read-refused", "chmod-refused", "env-refused", "env-chmod-refused"):
        assert refused in out
    assert "env-rename-refused" in out and "env-remove-refused" in out
    assert "no-guest-mount" in out and "not-found" in out
    assert PUBLIC in out  # allow twin: the rest of home reads
    assert (ssh / "id_ed25519").read_text() == SECRET  # untouched on the host
    assert (ws / ".env").read_text() == f"TOKEN={SECRET}\n" and not (ws / "moved").exists()


@pytest.mark.slow
def test_secrets_created_after_launch_stay_absent(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    script = """
        touch started
        while [ ! -e go ]; do sleep 0.1; done
        cat "$HOME/.aws/credentials" || echo secret-absent
        cat late.txt
    """
    proc = vm_popen(c, ws, "--", "sh", "-c", script)
    try:
        assert wait_for(lambda: (ws / "started").exists(), 120)
        aws = c.home / ".aws"
        aws.mkdir()
        (aws / "credentials").write_text(SECRET)  # a key made mid-run
        (ws / "late.txt").write_text(PUBLIC)  # allow twin: a new workspace file shows
        c.chown(aws, ws / "late.txt")
        (ws / "go").write_text("")
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert SECRET not in out.decode() and "secret-absent" in out.decode()
    assert PUBLIC in out.decode()


@pytest.mark.slow
def test_write_protected_paths_are_read_only(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    hooks = ws / ".git" / "hooks"
    hooks.mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n")
    c.chown(ws / ".git")
    script = """
        echo "[alias] x = !evil" >> .git/config || echo config-refused
        touch .git/hooks/pre-commit || echo hooks-refused
        echo fine > src.txt && echo src-ok
    """
    r = vm(c, ws, "--", "sh", "-c", script)
    out = r.stdout.decode()
    assert "config-refused" in out and "hooks-refused" in out
    assert (ws / ".git" / "config").read_text() == "[core]\n"
    assert not (hooks / "pre-commit").exists()
    assert "src-ok" in out and (ws / "src.txt").read_text() == "fine\n"  # allow twin


@pytest.mark.slow
def test_a_secrets_directory_cannot_be_renamed_from_the_guest(
    sandbox: tuple[Corral, Path],
) -> None:
    """The directories between the workspace and a masked secret are mounts in
    QEMU's view (fsplan's pins), so the guest's rename of one fails on the host
    side of 9p: no run can move apps/web/.env away from where another run's
    plan masks it.  Twin: a directory holding nothing protected renames."""
    c, ws = sandbox
    (ws / "apps" / "web").mkdir(parents=True)
    (ws / "apps" / "web" / ".env").write_text(f"KEY={SECRET}\n")
    (ws / "apps" / "plain").mkdir()
    c.chown(ws / "apps")
    script = "mv apps/web apps/x || echo pinned; mv apps/plain apps/plain2 && echo twin-ok"
    r = vm(c, ws, "--", "sh", "-c", script)
    out = r.stdout.decode()
    assert "pinned" in out and b"Device or resource busy" in r.stderr, (out, r.stderr)
    assert (ws / "apps" / "web" / ".env").read_text() == f"KEY={SECRET}\n"
    assert "twin-ok" in out and (ws / "apps" / "plain2").is_dir()


def _leftovers(c: Corral, ws: Path) -> list[str]:
    """What a run could leave: half-written cache files, door sockets."""
    found = glob.glob(os.path.join(cache_for(c), "corral", "vm", "*.tmp*"))
    return found + glob.glob(os.path.join(tmp_for(c, ws), "*"))


@pytest.mark.slow
def test_a_timeout_stops_the_whole_vm(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    before = set(_leftovers(c, ws))
    # the timeout counts from corral's start: the guest's boot (2 to 5 s under TCG,
    # more on a busy host) is part of it
    proc = vm_popen(c, ws, "--timeout", "20", "--", "sh", "-c", "touch started; sleep 120")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 124, err
    assert (ws / "started").exists()  # it did run (the allow twin: the VM worked)
    assert b"timed out after 20s" in err
    assert wait_for(lambda: not qemus_of(proc.pid), 5)
    assert set(_leftovers(c, ws)) == before


@pytest.mark.slow
def test_a_killed_corral_takes_the_vm_with_it(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    proc = vm_popen(c, ws, "--", "sh", "-c", "touch started; sleep 120")
    try:
        assert wait_for(lambda: (ws / "started").exists(), 120)
        assert qemus_of(proc.pid)  # the VM is there while its runner lives
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_for(lambda: not qemus_of(proc.pid), 10), qemus_of(proc.pid)
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.slow
def test_limits_bound_the_guest(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    script = """
        nproc
        awk '/MemTotal/ {print $2}' /proc/meminfo
        python3 -c "$FORKS"
        python3 -c "$EAT" 2 && echo small-ok
        python3 -c "$EAT" 40 && echo big-ok
        echo big-exit=$?
    """
    forks = (  # as many children as the pids bound lets it start (the shell would die)
        "import os, time\n"
        "kids = []\n"
        "for _ in range(80):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "print(f'started={len(kids)}')\n"
        "for pid in kids:\n"
        "    os.kill(pid, 9)\n"
    )
    eat = (  # 16 MiB at a time, each page touched: the OOM killer, not a failed malloc
        "import sys\nkept = [bytearray(16 << 20) for _ in range(int(sys.argv[1]))]\n"
    )
    script = f"FORKS={shlex.quote(forks)}\nEAT={shlex.quote(eat)}\n{script}"
    r = vm(c, ws, "--memory", "256M", "--cpus", "2", "--pids", "40", "--", "sh", "-c", script)
    lines = r.stdout.decode().split()
    assert lines, r.stderr
    assert lines[0] == "2"  # vCPUs
    assert 150_000 < int(lines[1]) <= 256 * 1024  # guest RAM, kB, less the kernel's share
    started = int(next(w for w in lines if w.startswith("started=")).split("=")[1])
    assert 0 < started < 40  # the pids bound held; some started (allow twin)
    assert "small-ok" in lines and "big-ok" not in lines
    assert "big-exit=137" in lines  # the guest's OOM killer, not the host's


@pytest.mark.slow
def test_the_door_is_the_only_way_out(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    ok, bad = Origin(), Origin()
    try:
        script = f"""
            ip -o link | awk '{{print $2}}'
            {CURL} -x "$HTTP_PROXY" http://127.0.0.1:{ok.port}/allowed
            {CURL} -x "$HTTP_PROXY" http://127.0.0.1:{bad.port}/denied; echo
            python3 -c "$DIRECT"
        """
        direct = (  # straight to a host address, past the proxy
            "import socket; s = socket.socket(); s.settimeout(5); "
            f'print("direct", s.connect_ex(("10.0.2.2", {ok.port})))'
        )
        script = f"DIRECT={shlex.quote(direct)}\n{script}"
        r = vm(c, ws, "--allow", f"127.0.0.1:{ok.port}", "--", "sh", "-c", script)
    finally:
        ok.close()
        bad.close()
    out = r.stdout.decode()
    assert out.split()[0] == "lo:" and "eth" not in out  # no network device at all
    assert "hello from origin" in out and ok.hits == [("GET", "/allowed")]  # allow twin
    assert '"decision":"deny"' in out.replace(" ", "") and bad.hits == []
    assert "direct 0" not in out


@pytest.mark.slow
def test_an_allowed_host_service_is_reached_at_its_own_address(
    sandbox: tuple[Corral, Path],
) -> None:
    c, ws = sandbox
    ok, other = Origin(), Origin()
    try:
        direct = "curl -sS --noproxy '*' --max-time 20"  # past the proxy variables
        script = f"""
            {direct} http://127.0.0.1:{ok.port}/own
            {direct} http://127.0.0.1:{other.port}/other || echo other=refused
        """
        r = vm(c, ws, "--allow", f"127.0.0.1:{ok.port}", "--", "sh", "-c", script)
    finally:
        ok.close()
        other.close()
    out = r.stdout.decode()
    assert "hello from origin" in out and ok.hits == [("GET", "/own")]
    assert "other=refused" in out and other.hits == []  # the guest's own loopback: nothing there


@pytest.mark.slow
def test_lookups_go_to_the_relays_resolver_and_blocked_names_are_named(
    sandbox: tuple[Corral, Path],
) -> None:
    c, ws = sandbox
    script = "getent hosts blocked.example.net; getent hosts allowed.example.net; true"
    r = vm(c, ws, "--allow", "allowed.example.net", "--", "sh", "-c", script)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "corral: blocked: blocked.example.net" in err, err  # asked, refused, recorded
    assert "allowed.example.net" not in err  # the twin: an allowed name is no denial


@pytest.mark.slow
def test_tls_inspection_swaps_a_secret_in_and_its_echo_out(sandbox: tuple[Corral, Path]) -> None:
    """The guest trusts corral's CA (over its system bundle) with nothing told; the
    origin gets the real value, the guest sees only the placeholder, an echo
    included; the twin: the placeholder to a host the secret may not go to is
    refused inside HTTPS and never leaves corral."""
    c, ws = sandbox
    ca_dir = c.base / "origin-ca"
    ca = OriginCA(ca_dir)
    for path in [ca_dir, *ca_dir.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    origin = TlsOrigin(ca.server_files())
    port = origin.port
    policy = ws / "corral.toml"
    policy.write_text(
        "[network]\n"
        'mode = "proxy"\n'
        f'allow = ["origin.test:{port}", "other.test:{port}", "127.0.0.1:{port}"]\n'
        'hosts = { "origin.test" = "127.0.0.1", "other.test" = "127.0.0.1" }\n'
        "[tls]\n"
        'inspect = ["origin.test", "other.test"]\n'
        f'upstream_ca = "{ca.cert_path}"\n'
        "[secrets.API_KEY]\n"
        'from = "env:CORRAL_TEST_KEY"\n'
        f'hosts = ["origin.test:{port}"]\n'
    )
    c.chown(policy)
    get = 'curl -sS --max-time 20 -H "x-key: $API_KEY"'
    script = f"""
        echo "key=$API_KEY"
        {get} https://origin.test:{port}/echo/mine; echo
        {get} https://other.test:{port}/echo/elsewhere; echo
    """
    real = "sk-real-4c1f" + "9" * 24
    env = {**vm_env(c, ws), "CORRAL_TEST_KEY": real}
    try:
        r = subprocess.run(
            vm_argv(c, ["--", "sh", "-c", script]),
            cwd=ws, env=env, capture_output=True, timeout=180, input=b"",
        )  # fmt: skip
    finally:
        origin.close()
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr
    placeholder = out.split("key=", 1)[1].split()[0]
    assert placeholder.startswith("corral-secret-API_KEY-") and real not in out + r.stderr.decode()
    echoed = json.loads(out.splitlines()[1])  # the origin's echo, through the guest's curl
    assert ["x-key", placeholder] in echoed["headers"]  # its value hidden again
    got = [(x["target"], {h[0]: h[1] for h in x["headers"]}.get("x-key")) for x in origin.requests]
    assert got == [
        ("/echo/mine", real)  # the real value reached the origin; the twin never left
    ]
    assert '"rule":"secret-wrong-host"' in out.replace(" ", "")


@pytest.mark.slow
def test_proxy_death_means_no_network(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    ok = Origin()
    script = f"""
        {CURL} -x "$HTTP_PROXY" http://127.0.0.1:{ok.port}/before && touch first-ok
        while [ ! -e killed ]; do sleep 0.1; done
        {CURL} -x "$HTTP_PROXY" http://127.0.0.1:{ok.port}/after || echo after=failed
        echo finished
    """
    proc = vm_popen(c, ws, "--allow", f"127.0.0.1:{ok.port}", "--", "sh", "-c", script)
    try:
        assert wait_for(lambda: (ws / "first-ok").exists(), 120)
        doors = glob.glob(os.path.join(tmp_for(c, ws), "corral-door-*"))
        pids = [int(p) for d in doors for p in Path(d, "proxy.pid").read_text().split()]
        assert pids, doors
        for pid in pids:  # every worker of this run's proxy
            os.kill(pid, signal.SIGKILL)
        (ws / "killed").write_text("")
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        ok.close()
    text = out.decode()
    assert "hello from origin" in text and "after=failed" in text and "finished" in text, err
    assert ok.hits == [("GET", "/before")]
    assert wait_for(lambda: not qemus_of(proc.pid), 5)


@pytest.mark.slow
def test_a_guest_that_does_not_boot_in_time_is_stopped(sandbox: tuple[Corral, Path]) -> None:
    """The boot watchdog, made short enough that no boot meets it."""
    c, ws = sandbox
    code = (
        "import sys; from corral.vm import run; run.BOOT_TIMEOUT = 0.3; "
        "sys.exit(run.main(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        c.python_argv(["-c", code, "--", "touch", "ran"]),
        cwd=ws,
        env=c.env({"XDG_CACHE_HOME": cache_for(c), "CORRAL_VM_WARM": "0"}),  # a boot
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 125
    assert b"the guest did not boot within 0.3 s" in err
    assert not (ws / "ran").exists()
    assert wait_for(lambda: not qemus_of(proc.pid), 5)


@pytest.mark.slow
def test_host_unix_sockets_are_names_the_guest_cannot_reach(sandbox: tuple[Corral, Path]) -> None:
    """The view does not mask host sockets (a vanished one would fail QEMU's
    bubblewrap): over 9p a socket is only a name, and connect() in the guest
    reaches the guest's kernel alone."""
    import socket

    c, ws = sandbox
    host_sock = ws / "host.sock"  # the workspace is shared as it is, sockets included
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(host_sock))
    server.listen(4)
    server.settimeout(0.1)
    os.chown(host_sock, c.uid, c.gid)
    connect = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "print(sys.argv[1], s.connect_ex(sys.argv[2]))\n"
    )
    own = (  # the allow twin: a socket bound inside the guest works
        "import socket\n"
        "a = socket.socket(socket.AF_UNIX); a.bind('/tmp/own.sock'); a.listen(1)\n"
        "b = socket.socket(socket.AF_UNIX); print('own', b.connect_ex('/tmp/own.sock'))\n"
    )
    script = (
        f"CONNECT={shlex.quote(connect)}\nOWN={shlex.quote(own)}\n"
        f'ls -l {host_sock} | cut -c1\npython3 -c "$CONNECT" host {host_sock}\n'
        'python3 -c "$OWN"\n'
    )
    try:
        r = vm(c, ws, "--", "sh", "-c", script)
        try:
            server.accept()
            reached = True
        except OSError:
            reached = False
    finally:
        server.close()
    out = r.stdout.decode().split("\n")
    assert out[0] == "s", r.stderr  # the name is there, a socket...
    assert out[1].startswith("host ") and out[1] != "host 0"  # ...that leads nowhere
    assert out[2] == "own 0" and not reached


# ---- warm start: the saved state (corral.vm.snapshot) ------------------------------


def fresh_cache(c: Corral, ws: Path) -> tuple[dict[str, str], Path]:
    """An environment whose VM cache has the session's initramfs and accelerator
    answer (no boot probe again) but no saved state: the next run saves one."""
    source = Path(cache_for(c)) / "corral" / "vm"
    if not source.is_dir():  # nothing run yet this session: a run fills it
        vm(c, ws, "--", "true")
    top = ws.parent / "own-cache"
    vmdir = top / "corral" / "vm"
    vmdir.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.name.startswith(("initramfs-", "accel-")) and ".tmp" not in entry.name:
            (vmdir / entry.name).write_bytes(entry.read_bytes())
    for path in (top, top / "corral", vmdir, *vmdir.iterdir()):
        os.chown(path, c.uid, c.gid)
    return c.env({"XDG_CACHE_HOME": str(top), "TMPDIR": tmp_for(c, ws)}), vmdir


def states(vmdir: Path) -> list[Path]:
    return sorted(vmdir.glob("state-*"))


def run_in(
    c: Corral, ws: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        vm_argv(c, list(args)), cwd=ws, env=env, capture_output=True, timeout=180, input=b""
    )


FRESH = "date +%s; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; " + (
    "cat /proc/sys/kernel/random/boot_id; echo landed > landed.txt"
)


@pytest.mark.slow
def test_a_warm_start_is_saved_once_then_restored_with_its_own_randomness_and_clock(
    sandbox: tuple[Corral, Path],
) -> None:
    import time

    c, ws = sandbox
    env, vmdir = fresh_cache(c, ws)
    explained = run_in(c, ws, env, "--explain", "--", "true").stdout.decode()
    assert "start: cold boot: no saved state of this machine yet" in explained
    seen = []
    for n in range(3):
        (ws / "landed.txt").unlink(missing_ok=True)
        r = run_in(c, ws, env, "--", "sh", "-c", FRESH)
        assert r.returncode == 0, r.stderr
        assert (ws / "landed.txt").read_text() == "landed\n"  # the workspace, writable
        clock, random_bytes, boot_id = r.stdout.decode().split()
        assert abs(int(clock) - time.time()) < 10  # the host's time, not the state's
        seen.append((random_bytes, boot_id))
        assert len(states(vmdir)) == 1  # saved by the first run, used by the others
        if n == 0:
            explained = run_in(c, ws, env, "--explain", "--", "true").stdout.decode()
            assert "start: warm start: restore" in explained
    assert len({r for r, _ in seen}) == 3 and len({b for _, b in seen}) == 3
    assert os.stat(states(vmdir)[0]).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in vmdir.iterdir() if not p.name.startswith("state-")) == sorted(
        p.name for p in vmdir.iterdir() if p.name.startswith(("initramfs-", "accel-"))
    )  # no temporary file beside it


@pytest.mark.slow
def test_secrets_stay_masked_in_a_restored_guest(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    env, vmdir = fresh_cache(c, ws)
    secret = c.home / ".ssh" / "id_ed25519"
    secret.parent.mkdir()
    secret.write_text(SECRET)
    c.chown(c.home)
    assert run_in(c, ws, env, "--", "true").returncode == 0 and states(vmdir)
    r = run_in(c, ws, env, "--", "sh", "-c", f"cat {secret}; cat /etc/hostname >/dev/null; echo $?")
    assert SECRET.encode() not in r.stdout and r.stdout.strip().endswith(b"0")  # the twin: public


@pytest.mark.slow
def test_a_state_that_does_not_restore_is_replaced_and_the_vm_boots(
    sandbox: tuple[Corral, Path],
) -> None:
    c, ws = sandbox
    env, vmdir = fresh_cache(c, ws)
    assert run_in(c, ws, env, "--", "true").returncode == 0
    (state,) = states(vmdir)
    state.write_bytes(b"QEVM not a state")
    r = run_in(c, ws, env, "--", "echo", "still runs")
    assert (r.returncode, r.stdout) == (0, b"still runs\n"), r.stderr
    assert b"the saved VM state did not restore" in r.stderr and b"booting" in r.stderr
    (again,) = states(vmdir)
    assert again.stat().st_size > 1 << 20  # a real state saved by that boot
    r = run_in(c, ws, env, "--", "echo", "restored")
    assert (r.returncode, r.stdout, r.stderr) == (0, b"restored\n", b"")


@pytest.mark.slow
def test_turned_off_the_vm_boots_and_nothing_is_saved(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    env, vmdir = fresh_cache(c, ws)
    env = {**env, "CORRAL_VM_WARM": "0"}
    assert (
        "cold boot: warm start turned off"
        in run_in(c, ws, env, "--explain", "--", "true").stdout.decode()
    )
    r = run_in(c, ws, env, "--", "echo", "booted")
    assert (r.returncode, r.stdout) == (0, b"booted\n") and not states(vmdir)


def _saving(qemu_pids: list[int], vmdir: Path) -> bool:
    """QEMU holds the unnamed file it writes a state into (O_TMPFILE: "#N (deleted)")."""
    for pid in qemu_pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        if any(link.startswith(f"{vmdir}/#") for link in links):
            return True
    return False


@pytest.mark.slow
def test_corral_killed_while_saving_leaves_no_state_and_no_vm(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    env, vmdir = fresh_cache(c, ws)
    before = sorted(p.name for p in vmdir.iterdir())
    proc = subprocess.Popen(
        vm_argv(c, ["--", "touch", "ran"]),
        cwd=ws,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert wait_for(lambda: _saving(qemus_of(proc.pid), vmdir), 120)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_for(lambda: not qemus_of(proc.pid), 10), qemus_of(proc.pid)
    finally:
        proc.kill()
        proc.communicate()
    assert sorted(p.name for p in vmdir.iterdir()) == before  # no state, whole or half
    assert not (ws / "ran").exists()  # killed before the request was sent
    r = run_in(c, ws, env, "--", "touch", "ran")  # the twin: the next run saves one
    assert r.returncode == 0 and (ws / "ran").exists() and len(states(vmdir)) == 1
