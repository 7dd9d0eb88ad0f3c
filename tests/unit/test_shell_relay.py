"""corral shell behind a sandbox's own terminal (the microvm tier): the relay that
runs inside (corral.shell.TTY_RELAY, here run by this host's Python, with a real
pty and shell) and corral shell's side that frames its terminal for it
(corral.shell._Relay), joined by pipes instead of QEMU's stdin and stdout ports."""

from __future__ import annotations

import fcntl
import os
import pty
import shutil
import struct
import subprocess
import sys
import termios
import threading

import pytest

from corral import shell
from corral.tiers.base import LaunchStrategy
from corral.tiers.microvm import VmStrategy


def relay(args: list[str], data: bytes) -> subprocess.CompletedProcess[bytes]:
    argv = shell.relayed(args, [sys.executable])
    return subprocess.run(argv, input=data, capture_output=True, timeout=30)


def size(rows: int, cols: int) -> bytes:
    return shell.frame(b"w", struct.pack("HHHH", rows, cols, 0, 0))


def test_the_relay_runs_the_shell_on_a_terminal_of_its_own_at_the_size_it_is_sent() -> None:
    typed = b"echo A$((6*7))B; stty size; tty\n"
    r = relay(["sh", "-i"], size(31, 101) + shell.frame(b"d", typed))
    out = r.stdout.replace(b"\r\n", b"\n")
    assert b"A42B\n31 101\n/dev/pts/" in out, out  # a terminal, at the size sent first
    assert r.returncode == 0  # the end of its input: a ^D, the shell's end


def test_a_size_sent_later_reaches_the_shell_and_its_exit_code_is_the_relays() -> None:
    argv = shell.relayed(["sh", "-i"], [sys.executable])
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(size(31, 101) + shell.frame(b"d", b"stty size\n"))
    proc.stdin.flush()
    seen = b""
    while b"31 101" not in seen:  # the shell has asked once: now the size changes
        seen += os.read(proc.stdout.fileno(), 4096)
    proc.stdin.write(size(40, 120) + shell.frame(b"d", b"stty size; exit 3\n"))
    out, _ = proc.communicate(timeout=30)
    assert b"40 120" in out, seen + out
    assert proc.returncode == 3
    killed = relay(["sh", "-c", "kill -TERM $$"], size(24, 80))
    assert killed.returncode == 128 + 15  # a signal, shell style


@pytest.mark.parametrize("sh", [["bash", "--norc", "-i"], ["busybox", "sh", "-i"]])
def test_the_end_of_the_relays_input_ends_the_shell_as_the_end_of_a_file_would(
    sh: list[str],
) -> None:
    """No ``exit`` typed: the shell ends with its last command's code.  bash's and
    busybox's line editors reset the terminal as they start: a single ^D sent then
    reached them as a NUL (busybox's put it in its line), and they waited forever."""
    if not shutil.which(sh[0]):
        pytest.skip(f"no {sh[0]} here")
    ended = relay(sh, size(24, 80) + shell.frame(b"d", b"echo piped$((1+1)); false\n"))
    assert ended.returncode == 1, ended.stdout
    assert b"piped2" in ended.stdout
    assert relay(sh, size(24, 80)).returncode == 0  # nothing typed at all
    twin = relay(sh, size(24, 80) + shell.frame(b"d", b"echo piped; exit 5\n"))
    assert twin.returncode == 5, twin.stdout  # an exit of its own


def test_a_frame_split_across_reads_is_put_back_together() -> None:
    whole = size(31, 101) + shell.frame(b"d", b"echo joined\n")
    argv = shell.relayed(["sh", "-i"], [sys.executable])
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    for i in range(0, len(whole), 3):  # three bytes at a time: frames cut anywhere
        proc.stdin.write(whole[i : i + 3])
        proc.stdin.flush()
    out, _ = proc.communicate(timeout=30)
    assert b"joined\r\n" in out.split(b"echo joined")[-1]  # run once, as typed


def test_a_shell_that_cannot_start_is_said_in_corrals_words() -> None:
    missing = relay(["no-such-shell"], size(24, 80))
    assert missing.returncode == 127
    assert b"corral: no-such-shell: command not found in the sandbox (PATH=" in missing.stdout
    here = relay([os.devnull], size(24, 80))
    assert here.returncode == 126 and b"corral: cannot run /dev/null" in here.stdout
    ok = relay(["sh", "-c", "echo started"], size(24, 80))  # the twin
    assert (ok.returncode, ok.stdout) == (0, b"started\r\n")


def test_corral_shell_frames_its_terminal_and_each_resize_and_passes_the_output() -> None:
    master, slave = pty.openpty()  # our terminal
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 31, 101, 0, 0))
    in_r, in_w = os.pipe()  # the sandbox's stdin
    out_r, out_w = os.pipe()  # its terminal's output
    end_r, end_w = os.pipe()  # stands for the launched process's pidfd
    dst_r, dst_w = os.pipe()  # our stdout
    relay = shell._Relay(in_w, out_r, end_r, src=slave, dst=dst_w)
    looping = threading.Thread(target=relay.run, daemon=True)
    looping.start()
    got = b""

    def until(n: int) -> bytes:
        nonlocal got
        while len(got) < n:
            got += os.read(in_r, 4096)
        taken, got = got[:n], got[n:]
        return taken

    try:
        assert until(13) == size(31, 101)  # the size first
        os.write(master, b"ab\n")
        assert until(8) == shell.frame(b"d", b"ab\n")
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        relay.resized.append(True)  # what the SIGWINCH handler does, and its wakeup
        os.write(relay.wake_w, b"\0")
        assert until(13) == size(40, 120)
        os.write(out_w, b"the shell says")
        os.close(out_w)
        os.write(end_w, b"x")  # the sandbox ended: its output drained, the loop done
        looping.join(timeout=5)
        assert not looping.is_alive()
        os.close(dst_w)
        assert os.read(dst_r, 4096) == b"the shell says"
    finally:
        relay.close()
        for fd in (master, slave, in_r, end_r, end_w, dst_r):
            os.close(fd)


def test_only_the_microvm_strategy_puts_a_relay_in_front_of_the_shell() -> None:
    assert LaunchStrategy.shell_command(["sh"], ["py"])[-2:] == [shell.CTTY_SHIM, "sh"]
    assert not LaunchStrategy.own_terminal and VmStrategy.own_terminal
    assert VmStrategy.shell_command(["sh", "-i"], ["py"]) == shell.relayed(["sh", "-i"], ["py"])
    assert not VmStrategy.shell  # corral shell runs there
