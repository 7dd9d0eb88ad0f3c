"""The guest's initramfs: busybox, the kernel modules, corral's init and helpers.

Built by a pure function (:func:`archive`) from host files and cached by the
digest of everything that goes in (:func:`cached`): the same kernel modules,
busybox and corral version give the same file, built once.

The init (:data:`INIT`, a busybox shell script, pid 1) needs no Python, so a
command without a network starts a few hundred milliseconds sooner under TCG
than it would behind a Python agent.  It:

1. powers off at once with ``corral.mode=off`` on the kernel command line (the
   benchmark's "raw boot" baseline), loads the modules, finds the control port
   and, with ``corral.mode=probe``, says ``ready`` there and powers off (the
   accelerator probe);
2. reads the run's *request* from the control port (and says ``up``: the host
   stops waiting for the boot): a shell script the host
   builds (:func:`corral.vm.guest.request`) that calls the functions below to
   mount the host's view over 9p, the private tmpfs, the writable exports, and
   finally ``run``;
3. ``run`` starts the command in the guest's root (chroot), in a cgroup with
   the pids bound, as the caller's uid and gid, with only the request's
   environment, its stdin, stdout and stderr on their own virtio-serial ports;
4. when the command ends: kills what is left, syncs (9p writes are on the host
   before corral reads the result), and reports ``exit CODE OUT ERR OOM`` on the
   control port: the exit status (128+N for a signal), how many bytes the guest
   queued on the stdout and stderr ports (from the driver's debugfs counters:
   the host reads exactly that much, so no output is lost in flight), and the
   cgroup's OOM kills.
"""

from __future__ import annotations

import hashlib
import os

from corral.vm import cpio, guestpython, snapshot

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.vm.guestpython import Closure
    from corral.vm.setup import Assets

BUILD_VERSION = "11"  # bumped when the layout changes, so old cached archives are not used
KEEP = 4  # images kept in a cache: a Sandbox's and a run's for this corral and one other
# corral's own files the guest needs when its network goes through the door
HELPERS = (("vm", "mux.py"), ("vm", "guestdoor.py"), ("net", "relay.py"), ("", "agent.py"))
# in the initramfs, the guest root's /dev (not under /corral, whose files are copied)
DEV_TEMPLATE = "guest-dev"
DEV_NODES: tuple[tuple[str, int, int], ...] = (
    *(("null", 1, 3), ("zero", 1, 5), ("full", 1, 7)),
    *(("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0)),
)
DEV_LINKS: tuple[tuple[str, str], ...] = (
    *(("ptmx", "pts/ptmx"), ("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")),
    *(("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")),
)
MSIZE = 512000  # the largest 9p message the virtio transport takes: fewer round trips

INIT = r"""#!/bin/busybox sh
# corral's guest init: see corral/vm/initramfs.py.  pid 1, in the initramfs.
# Applets are called by name: this busybox's shell runs many of them in its own
# process (no fork, no exec), which under TCG saves tens of milliseconds each.
R=/mnt
export PATH=/bin
fail() {  # the host stops the VM once it has read the error (powered off at once, the
	# VM could take the line with it); should it never, after 10 s
	if [ -n "$CTL" ]; then
		echo "error $*" >&3
		read -r -t 10 _ <&3
	else
		echo "corral-init: $*" >&2
	fi
	poweroff -f
}
/bin/busybox mount -t proc proc /proc  # applets are run through /proc/self/exe
read -r CMDLINE </proc/cmdline
case " $CMDLINE " in *" corral.mode=off "*) poweroff -f;; esac
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
# no console (the usual case): the init has no stdin, stdout or stderr at all
for fd in 0 1 2; do [ -e /proc/self/fd/$fd ] || eval "exec $fd<>/dev/null"; done
set -- @MODULES@
loadmods @MODULE_FILES@ || { eval "m=\${$?}"; fail "cannot load module $m"; }

# ports N NAME...: wait until N virtio-serial ports have their names and device
# nodes, the ports NAME... among them, setting PORT_<name> to each one's device
# (corral.ctl -> PORT_ctl=/dev/vport0p1).  Ports come up one by one, in no set
# order: the first one named need not be the one asked for.  Up to a minute of
# the guest's clock: on a busy host a TCG guest gets a small share of a CPU
# while its clock runs at the host's pace.
ports() {
	need=$1
	shift
	missing=
	for x in "$@"; do eval "[ -n \"\$PORT_$x\" ]" || missing=$x; done
	# all found already (by a Sandbox's machine, before its state was saved): under
	# TCG a restored guest's first walk of sysfs costs ~10 ms
	[ -z "$missing" ] && return 0
	i=0
	while [ $i -lt 12000 ]; do
		n=0
		for d in /sys/class/virtio-ports/*; do
			[ -e "$d/name" ] && read -r name <"$d/name" && [ -n "$name" ] || continue
			[ -e "/dev/${d##*/}" ] || continue
			eval "PORT_${name#corral.}=/dev/${d##*/}"
			n=$((n + 1))
		done
		if [ $n -ge "$need" ]; then
			missing=
			for x in "$@"; do eval "[ -n \"\$PORT_$x\" ]" || missing=$x; done
			[ -z "$missing" ] && return 0
		fi
		usleep 5000
		i=$((i + 1))
	done
	return 1
}
ports 1 ctl || fail "no control port"
CTL=$PORT_ctl
exec 3<>"$CTL"
case " $CMDLINE " in *" corral.mode=probe "*) echo ready >&3; poweroff -f;; esac
ip link set lo up
hostname corral
# the stdout and stderr ports' byte counters, read after the command (finish)
mount -t debugfs debugfs /sys/kernel/debug

# The functions the request calls.  Mounts are queued as fstab lines and made by
# one `mount -a` per batch: a process costs the guest ~10 ms under TCG, a mount a
# few.  A batch is made before anything that needs it in place: the copy into
# /dev, a mount point that may lie under a queued mount (the request says
# `mounts` there), and the run.
FSTAB=/fstab  # (not under /corral, whose files a run may copy)
: >$FSTAB
queue() {  # SOURCE TARGET TYPE OPTIONS; the target escaped as fstab wants it
	t=$2
	t=${t//\\/\\134}
	t=${t// /\\040}
	t=${t//	/\\011}
	t=${t//
/\\012}
	printf '%s %s %s %s 0 0\n' "$1" "$t" "$3" "$4" >>$FSTAB
}
mounts() {  # make the queued mounts (all of them, or the run is refused)
	[ -s $FSTAB ] || return 0
	mount -a -T $FSTAB 2>/mount-error || {
		read -r why </mount-error
		fail "cannot mount: ${why:-mount -a failed}"
	}
	: >$FSTAB
}
P9=trans=virtio,version=9p2000.L,access=client,msize=@MSIZE@
# The guest's own kernel files for the command's root (/proc, /sys with the cgroup
# tree, /dev), made under $S before the host may save the state (stage), then
# moved into the root by the request: a restored guest makes no fresh mount and
# copies nothing of them (under TCG each is code running for the first time).
S=/stage
stage() {
	mkdir -p $S/proc $S/sys $S/dev || fail "cannot make $S"
	queue proc $S/proc proc nosuid,nodev,noexec
	queue sys $S/sys sysfs ro,nosuid,nodev,noexec
	queue cgroup2 $S/sys/fs/cgroup cgroup2 nosuid,nodev,noexec
	queue dev $S/dev tmpfs nosuid,noexec,mode=755,size=65536
	mounts
	# the few nodes a command needs, made in the initramfs (DEV_TEMPLATE): one cp
	# instead of a dozen mknod, mkdir and ln, each a process under TCG
	cp -a /@DEV@/. $S/dev/ || fail "cannot fill /dev"
	queue devpts $S/dev/pts devpts newinstance,ptmxmode=0666,mode=620,nosuid,noexec
	mounts
	# the command's cgroup (run puts the command, or the waiting agent, in it)
	echo "+pids +memory" >$S/sys/fs/cgroup/cgroup.subtree_control \
		&& mkdir $S/sys/fs/cgroup/corral || fail "no cgroup"
}
mount_root() {  # TAG CACHE: the host's view, read-only, and the guest's own kernel files
	queue "$1" $R 9p "$P9,cache=$2,ro,nosuid"
	for d in proc sys dev; do queue $S/$d $R/$d none move; done
	mounts
}
# A mount point missing from the view is made (in a tmpfs mounted before it).
mount_tmpfs() {  # PATH SIZE: private scratch, as on the namespace tier
	[ -d "$R$1" ] || mkdir -p "$R$1" || fail "cannot mount a tmpfs on $1"
	queue tmpfs "$R$1" tmpfs "nosuid,nodev,mode=1777,size=$2"
}
mount_rw() {  # TAG PATH CACHE: a writable export (the workspace...)
	[ -d "$R$2" ] || mkdir -p "$R$2" || fail "cannot mount $2 ($1)"
	queue "$1" "$R$2" 9p "$P9,cache=$3,nosuid"
}

# lookup NAME PATH CWD: the program a bare NAME means, searched in PATH inside the
# guest's root the way execvp would (busybox would run its own applet of that
# name instead).  An entry that is a symlink counts as found: it may point by an
# absolute path that only resolves inside the guest's root.
lookup() {
	case $1 in */*) PROG=$1; return 0;; esac
	set -f
	old=$IFS
	IFS=:
	for x in $2; do
		case $x in /*) p=$R$x/$1;; *) p=$R$3/${x:-.}/$1;; esac
		if [ -L "$p" ] || { [ -f "$p" ] && [ -x "$p" ]; }; then
			PROG=${x:-.}/$1
			IFS=$old
			return 0
		fi
	done
	IFS=$old
	return 1
}

# fresh SEED TIME: a guest restored from a saved state (corral.vm.snapshot) shares
# its kernel's random state and its clock with every other guest restored from it:
# the host's fresh SEED is mixed into the pool and the kernel's generator reseeded
# from it at once (/bin/reseed, before anything in the guest draws a random
# number), and the clock set to the host's TIME (seconds since the epoch), by the
# same process.
fresh() {
	echo "$1" >/dev/urandom || fail "cannot write to the guest's random generator"
	/bin/reseed "$2" || fail "cannot reseed the guest's random generator or set its clock"
}

# counter VAR FILE KEY: VAR=the number after KEY in FILE (0 if none)
counter() {
	eval "$1=0"
	while read -r k v; do [ "$k" = "$3" ] && eval "$1=\$v"; done <"$2"
}

run() {  # UID GID PIDS NET DUPLEX CWD (ENV... -- ARGV... | GO)
	uid=$1 gid=$2 pids=$3 net=$4 duplex=$5 cwd=$6
	shift 6
	mounts
	[ -d "$R$cwd" ] || fail "cannot enter $cwd"
	c=$R/sys/fs/cgroup
	[ -d $c/corral ] || fail "no cgroup"
	[ "$pids" = - ] || echo "$pids" >$c/corral/pids.max || fail "cannot bound pids"
	want=4
	if [ "$net" = 1 ]; then
		want=5
		# the relay binds the resolver's port 53 as the command's user, as it does in
		# the namespace tier's own network namespace; this kernel is the guest's alone
		echo 0 >/proc/sys/net/ipv4/ip_unprivileged_port_start || fail "cannot open low ports"
	fi
	if [ "$net" = 1 ] || [ "$duplex" = 1 ]; then  # corral's helpers: relay, agent
		# (*.py: a Sandbox's machine also holds the agent's fifo there, which cp would read)
		mkdir -p $R/run/corral && cp /corral/*.py $R/run/corral/ \
			&& chown "$uid:$gid" $R/run/corral || fail "cannot prepare /run/corral"
	fi
	door=
	[ "$net" = 1 ] && door=door
	ports $want stdin stdout stderr $door || fail "no stdio ports"
	if [ "$net" = 1 ]; then
		[ -n "$PORT_door" ] || fail "no door port"
		# (a port opens once: a waiting agent opens it itself, as its relay's door)
		[ "$duplex" = 2 ] || exec 4<>"$PORT_door"
	fi
	if [ "$duplex" = 2 ]; then  # the agent waiting since the boot: GO is its one line
		kill -0 "$AGENT" 2>/dev/null && echo "$AGENT" >$c/corral/cgroup.procs \
			|| fail "corral's agent is not waiting"
		echo "$R ${PORT_door:--} $1" >/corral/go || fail "cannot start corral's agent"
		wait "$AGENT"
		finish $?
	fi
	# ENV... -- NAME ARGS  ->  ENV... PROGRAM ARGS (env -i takes NAME=VALUE words first)
	n=$# i=0 path= state=env code=
	while [ $i -lt $n ]; do
		a=$1
		shift
		i=$((i + 1))
		if [ $state = env ]; then
			case $a in --) state=cmd; continue;; PATH=*) path=${a#PATH=};; esac
		elif [ $state = cmd ]; then
			state=args
			if ! lookup "$a" "$path" "$cwd"; then
				echo "corral: $a: command not found" >"$PORT_stderr"
				code=127
			fi
			a=$PROG
			case $a in *=*)
				echo "corral: cannot run $a: its path holds =" >"$PORT_stderr"
				code=126;;
			esac
		fi
		set -- "$@" "$a"
	done
	if [ -z "$code" ]; then
		if [ "$duplex" = 1 ]; then  # a port opens once: stdout is stdin's descriptor
			exec 5<>"$PORT_stdin" 6>&5
		else
			exec 5<"$PORT_stdin" 6>"$PORT_stdout"
		fi
		# the subshell joins the cgroup (0: the writer itself), then becomes the command:
		# chroot, directory, uid and gid in one step; only the request's environment
		(echo 0 >$c/corral/cgroup.procs \
			&& exec nsenter -r"$R" -w"$R$cwd" -S "$uid" -G "$gid" env -i "$@") \
			<&5 >&6 2>"$PORT_stderr" 3>&- 5>&- 6>&-
		code=$?
		exec 5>&- 6>&-
	fi
	finish "$code"
}

finish() {  # CODE: the command has ended; the rest of the guest goes, then the report
	code=$1
	exec 4>&-
	kill -9 -1 2>/dev/null
	sync
	d=/sys/kernel/debug/virtio-ports
	counter out $d/${PORT_stdout##*/} bytes_sent:
	counter err $d/${PORT_stderr##*/} bytes_sent:
	counter oom $c/corral/memory.events oom_kill
	echo "exit $code $out $err $oom" >&3
	# the host stops the VM once it has the report and all the output (powered off
	# at once, the VM could take them with it); should it never, after 30 s
	read -r -t 30 _ <&3
	poweroff -f
}

# A Sandbox's machine (its initramfs carries the agent's Python, named in
# /corral/python with its libraries' directories): corral's agent starts here,
# before the state is saved, and waits at the fifo /corral/go (corral.agent's
# wait_for_go); it says it is ready by making /corral/ready.  Its stdin and
# stdout are the stdin port (the Sandbox's channel), its stderr the stderr port.
AGENT=
if [ -r /corral/python ]; then
	ports 4 stdin stderr || fail "no stdio ports"
	{ read -r py; read -r libs; } </corral/python
	mkfifo -m 600 /corral/go || fail "cannot make the agent's fifo"
	env -i LD_LIBRARY_PATH="$libs" "$py" -I -S /corral/agent.py --wait /corral/go /corral/ready \
		<>"$PORT_stdin" >&0 2>"$PORT_stderr" 3>&- &
	AGENT=$!
	until [ -e /corral/ready ]; do
		kill -0 "$AGENT" 2>/dev/null || fail "corral's agent did not start"
		usleep 5000
	done
fi

stage
# the host may save the VM's state here (the same for every run: no request yet)
echo waiting >&3
# the request: its number of lines, then the lines, read by the shell itself (a
# process, head's, cost a restored guest ~20 ms); a value's newline is a line's end
read -r lines <&3 || fail "no request"
REQUEST=
while [ "$lines" -gt 0 ]; do
	IFS= read -r line <&3 || fail "short request"
	REQUEST="$REQUEST$line
"
	lines=$((lines - 1))
done
printf '%s' "$REQUEST" >/request
echo up >&3
. /request
fail "the request did not run a command"
"""


# /bin/reseed [SECONDS]: ioctl(open("/dev/urandom"), RNDRESEEDCRNG), then, given
# SECONDS (decimal, since the epoch), clock_settime(CLOCK_REALTIME, {SECONDS, 0});
# exit status the first errno (0: reseeded and set; 22 for SECONDS not a number).
# Busybox has no applet that makes the kernel reseed at once, and a Python start
# costs the guest 0.3-0.7 s under TCG, so it is a 123-byte x86-64 program (written
# here, assembled with binutils' as, checked against objdump), in a minimal static
# ELF.  The clock is set here rather than by busybox's date: one process fewer in a
# restored guest, where every piece of code runs for the first time (~10 ms).
RESEED_CODE = (
    bytes.fromhex(
        "b802000000"  # mov eax, 2              open(
        "488d3d62000000"  # lea rdi, [rip+98]    "/dev/urandom",
        "31f6"  # xor esi, esi                    O_RDONLY)
        "0f05"  # syscall
        "89c7"  # mov edi, eax                  fd (a negative one: ioctl fails, EBADF)
        "b810000000"  # mov eax, 16             ioctl(fd,
        "be07520000"  # mov esi, 0x5207           RNDRESEEDCRNG,
        "31d2"  # xor edx, edx                    0)
        "0f05"  # syscall
        "85c0"  # test eax, eax
        "7538"  # jnz done                      refused: exit with its errno
        "48833c2402"  # cmp qword [rsp], 2      argc < 2: no time given,
        "7231"  # jb done                         exit 0
        "488b742410"  # mov rsi, [rsp+16]       argv[1]
        "31c0"  # xor eax, eax                  seconds = 0
        "0fb60e"  # digit: movzx ecx, byte [rsi]
        "85c9"  # test ecx, ecx
        "7414"  # jz set                        its end
        "83e930"  # sub ecx, '0'
        "83f909"  # cmp ecx, 9
        "7726"  # ja bad                        not a digit
        "486bc00a"  # imul rax, rax, 10
        "4801c8"  # add rax, rcx                seconds = seconds * 10 + digit
        "48ffc6"  # inc rsi
        "ebe5"  # jmp digit
        "6a00"  # set: push 0                   tv_nsec
        "50"  # push rax                        tv_sec
        "4889e6"  # mov rsi, rsp                clock_settime(CLOCK_REALTIME, &ts)
        "31ff"  # xor edi, edi
        "b8e3000000"  # mov eax, 227
        "0f05"  # syscall
        "89c7"  # done: mov edi, eax            exit(-result): 0, or the errno
        "f7df"  # neg edi
        "b83c000000"  # mov eax, 60
        "0f05"  # syscall
        "b8eaffffff"  # bad: mov eax, -22       EINVAL
        "ebee"  # jmp done
    )
    + b"/dev/urandom\0"
)  # at the lea's next instruction (offset 12) + 98
ELF_BASE = 0x400000


# /bin/loadmods FILE...: finit_module(open(FILE), "", 0) for each, in order, in one
# process; exit status 0, or the (1-based) number of the first FILE that did not
# load.  Busybox's insmod is a process per module (each a fork under TCG) that
# reads the file into its memory first; this lets the kernel read it.
LOADMODS_CODE = bytes.fromhex(
    "488b1c24"  # mov rbx, [rsp]                 argc
    "4c8d642410"  # lea r12, [rsp+16]            &argv[1]
    "41bd01000000"  # mov r13d, 1                i
    "4939dd"  # loop: cmp r13, rbx
    "733a"  # jae done
    "498b3c24"  # mov rdi, [r12]                 open(argv[i],
    "31f6"  # xor esi, esi                        O_RDONLY)
    "b802000000"  # mov eax, 2
    "0f05"  # syscall
    "85c0"  # test eax, eax
    "781f"  # js fail
    "89c7"  # mov edi, eax                       finit_module(fd,
    "488d3529000000"  # lea rsi, [rip+41]          "",
    "31d2"  # xor edx, edx                        0)
    "b839010000"  # mov eax, 313
    "0f05"  # syscall
    "85c0"  # test eax, eax
    "7809"  # js fail
    "4983c408"  # add r12, 8
    "49ffc5"  # inc r13
    "ebcb"  # jmp loop
    "4489ef"  # fail: mov edi, r13d              exit(i)
    "b83c000000"  # mov eax, 60
    "0f05"  # syscall
    "31ff"  # done: xor edi, edi                 exit(0)
    "b83c000000"  # mov eax, 60
    "0f05"  # syscall
    "00"  # "" (at the lea's next instruction, offset 46, + 41)
)


def reseed_program() -> bytes:
    return static_program(RESEED_CODE)


def loadmods_program() -> bytes:
    return static_program(LOADMODS_CODE)


def static_program(code: bytes) -> bytes:
    """The static ELF of x86-64 ``code``: one header, one loadable segment."""
    import struct

    headers = 64 + 56
    size = headers + len(code)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, v1
    elf = ident + struct.pack(
        "<HHIQQQIHHHHHH", 2, 0x3E, 1, ELF_BASE + headers, 64, 0, 0, 64, 56, 1, 0, 0, 0
    )
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0, ELF_BASE, ELF_BASE, size, size, 0x1000)
    return elf + segment + code


def init_script(modules: list[str]) -> str:
    files = " ".join(f"/lib/modules/{m}.ko" for m in modules)
    text = INIT.replace("@MODULES@", " ".join(modules)).replace("@MODULE_FILES@", files)
    text = text.replace("@MSIZE@", str(MSIZE))
    return text.replace("@DEV@", DEV_TEMPLATE)


def dev_entries() -> list[cpio.Entry]:
    """The guest root's ``/dev``, as the init copies it onto a tmpfs: the usual
    character devices (not the guest's consoles or virtio ports: those stay the
    init's), ``pts`` and ``shm`` to mount on, the standard links."""
    entries = [cpio.directory(DEV_TEMPLATE)]
    for name, major, minor in DEV_NODES:
        entries.append(cpio.char_device(f"{DEV_TEMPLATE}/{name}", major, minor))
    entries += [cpio.directory(f"{DEV_TEMPLATE}/{d}") for d in ("pts", "shm")]
    for name, target in DEV_LINKS:
        entries.append(cpio.symlink(f"{DEV_TEMPLATE}/{name}", target))
    return entries


class PythonFile:
    """One file of the agent's Python (:mod:`corral.vm.guestpython`), read."""

    __slots__ = ("data", "mode", "mtime", "path")

    def __init__(self, path: str, data: bytes, mode: int, mtime: int) -> None:
        self.path = path
        self.data = data
        self.mode = mode
        self.mtime = mtime


def archive(
    modules: list[tuple[str, bytes]],
    busybox: bytes,
    helpers: list[tuple[str, bytes]],
    python: tuple[str, list[str], list[PythonFile]] | None = None,
) -> bytes:
    """The initramfs: ``modules`` (name, bytes) in load order, a static ``busybox``,
    and corral's ``helpers`` (file name, bytes) in ``/corral``; a Sandbox's machine
    also has ``python``: its interpreter's path, its libraries' directories and
    its files, each at its host path."""
    entries = [
        cpio.directory("bin"),
        cpio.file("bin/busybox", busybox, 0o755),
        cpio.symlink("bin/sh", "busybox"),
        cpio.file("bin/reseed", reseed_program(), 0o755),
        cpio.file("bin/loadmods", loadmods_program(), 0o755),
        cpio.directory("corral"),
        *(cpio.file(f"corral/{name}", data) for name, data in helpers),
        cpio.directory("dev"),
        *dev_entries(),
        cpio.directory("lib"),
        cpio.directory("lib/modules"),
        *(cpio.file(f"lib/modules/{name}.ko", data) for name, data in modules),
        cpio.directory("mnt"),
        cpio.directory("proc"),
        cpio.directory("sys"),
        cpio.file("init", init_script([name for name, _ in modules]).encode(), 0o755),
    ]
    if python is not None:
        entries += python_entries(*python, taken={e.name for e in entries})
    return cpio.newc(entries)


def python_entries(
    interpreter: str, libdirs: list[str], files: list[PythonFile], taken: set[str]
) -> list[cpio.Entry]:
    """The agent's Python: ``/corral/python`` naming it and its library directories,
    then each file (its parent directories first); a path the initramfs already
    has is left out."""
    out = [cpio.file("corral/python", f"{interpreter}\n{':'.join(libdirs)}\n".encode())]
    made = set(taken)
    for f in sorted(files, key=lambda f: f.path):
        name = f.path.lstrip("/")
        if name in made:
            continue
        parts = name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent not in made:
                made.add(parent)
                out.append(cpio.directory(parent))
        made.add(name)
        out.append(cpio.file(name, f.data, f.mode & 0o777, f.mtime))
    return out


def helper_paths() -> list[tuple[str, str]]:
    """(name in /corral, path) of corral's own files the guest carries."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # corral/
    return [(name, os.path.join(here, package, name)) for package, name in HELPERS]


def helper_files() -> list[tuple[str, bytes]]:
    found = []
    for name, path in helper_paths():
        with open(path, "rb") as fh:
            found.append((name, fh.read()))
    return found


# The digests of the files an image is built from (busybox, the modules, corral's
# helpers), kept per process by the files' identities: hashing their 3 MB again
# cost each Sandbox start ~11 ms (three images looked up: the tier's health, a
# run's and a Sandbox's machine).
_CONTENT_DIGESTS: dict[tuple[str, ...], bytes] = {}


def _content_digest(paths: list[str]) -> bytes:
    key = tuple(snapshot.identity(p) for p in paths)
    found = _CONTENT_DIGESTS.get(key)
    if found is None:
        parts = []
        for path in paths:
            with open(path, "rb") as fh:
                parts.append(hashlib.sha256(fh.read()).digest())
        found = _CONTENT_DIGESTS[key] = b"".join(parts)
    return found


def find_busybox(candidates: tuple[str, ...] = ("/bin/busybox", "/usr/bin/busybox")) -> str | None:
    """A statically linked busybox on this host (Debian: busybox-static)."""
    for path in candidates:
        try:
            with open(path, "rb") as fh:
                head = fh.read(4096)
        except OSError:
            continue
        if head[:4] == b"\x7fELF" and b"/ld-linux" not in head and b"/ld-musl" not in head:
            return path  # no program interpreter named: static
    return None


def read_python(closure: Closure) -> tuple[str, list[str], list[PythonFile]]:
    files = []
    for guest_path, host_path in closure.files:
        with open(host_path, "rb") as fh:
            st = os.fstat(fh.fileno())
            files.append(PythonFile(guest_path, fh.read(), st.st_mode, int(st.st_mtime)))
    return closure.python, closure.libdirs, files


def cached(assets: Assets, busybox: str, cache: str, python: Closure | None = None) -> str:
    """The initramfs for ``assets`` in ``cache`` (with the agent's ``python``: a
    Sandbox's machine), built if no file of that digest is there."""
    inputs = [busybox, *(assets.module_path(n) for n in assets.modules)]
    inputs += [path for _, path in helper_paths()]
    digest = hashlib.sha256(BUILD_VERSION.encode())
    digest.update(init_script(assets.modules).encode())
    digest.update(reseed_program() + loadmods_program())
    digest.update(_content_digest(inputs))  # each file's sha256, in that order
    if python is not None:  # its files by identity: a plan does not read 12 MB
        digest.update(python.python.encode() + b"\0" + ":".join(python.libdirs).encode())
        for line in guestpython.identities(python):
            digest.update(line.encode("utf-8", "surrogateescape") + b"\0")
    path = os.path.join(cache, f"initramfs-{digest.hexdigest()[:16]}.cpio")
    if os.path.exists(path):
        snapshot.mark_used(path)  # the images an upgrade left behind go first
        return path
    with open(busybox, "rb") as fh:
        box = fh.read()
    modules = []
    for name in assets.modules:
        with open(assets.module_path(name), "rb") as fh:
            modules.append((name, fh.read()))
    helpers = helper_files()
    data = archive(modules, box, helpers, read_python(python) if python is not None else None)
    os.makedirs(cache, mode=0o700, exist_ok=True)
    work = f"{path}.tmp{os.getpid()}"
    with open(work, "wb") as fh:
        fh.write(data)
    os.rename(work, path)
    snapshot.prune(cache, KEEP, "initramfs-", ".cpio")
    return path
