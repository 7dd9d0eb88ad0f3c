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
2. reads the run's *request* from the control port: a shell script the host
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

from corral.vm import cpio

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.vm.setup import Assets

BUILD_VERSION = "1"  # bumped when the layout changes, so old cached archives are not used
# corral's own files the guest needs when its network goes through the door
HELPERS = (("vm", "mux.py"), ("vm", "guestdoor.py"), ("net", "relay.py"))
MSIZE = 512000  # the largest 9p message the virtio transport takes: fewer round trips

INIT = r"""#!/bin/busybox sh
# corral's guest init: see corral/vm/initramfs.py.  pid 1, in the initramfs.
B=/bin/busybox
R=/mnt
fail() {
	if [ -n "$CTL" ]; then echo "error $*" >&3; else echo "corral-init: $*" >&2; fi
	$B poweroff -f
}
$B mount -t proc proc /proc
CMDLINE=" $($B cat /proc/cmdline) "
case $CMDLINE in *" corral.mode=off "*) $B poweroff -f;; esac
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
# no console (the usual case): the init has no stdin, stdout or stderr at all
for fd in 0 1 2; do [ -e /proc/self/fd/$fd ] || eval "exec $fd<>/dev/null"; done
for m in @MODULES@; do $B insmod /lib/modules/$m.ko || fail "cannot load module $m"; done

# port NAME: the device of the virtio-serial port called NAME, once it is there
port() {
	i=0
	while [ $i -lt 500 ]; do
		for d in /sys/class/virtio-ports/*; do
			[ "$($B cat $d/name 2>/dev/null)" = "$1" ] && { echo /dev/${d##*/}; return 0; }
		done
		$B usleep 10000
		i=$((i + 1))
	done
	return 1
}
CTL=$(port corral.ctl) || fail "no control port"
exec 3<>$CTL
case $CMDLINE in *" corral.mode=probe "*) echo ready >&3; $B poweroff -f;; esac
$B ip link set lo up
$B hostname corral

# The functions the request calls.
mount_root() {  # TAG CACHE: the host's view, read-only, and the guest's own kernel files
	$B mount -t 9p -o trans=virtio,version=9p2000.L,access=client,msize=@MSIZE@,cache=$2,ro \
		"$1" $R || fail "cannot mount the host's view ($1)"
	$B mount -t proc -o nosuid,nodev,noexec proc $R/proc
	$B mount -t sysfs -o ro,nosuid,nodev,noexec sys $R/sys
	$B mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 $R/sys/fs/cgroup
	$B mount -t tmpfs -o nosuid,noexec,mode=755,size=65536 dev $R/dev
	for n in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
		IFS=: read -r name major minor <<EOF
$n
EOF
		$B mknod -m 666 $R/dev/$name c $major $minor
	done
	$B mkdir $R/dev/pts $R/dev/shm
	$B mount -t devpts -o newinstance,ptmxmode=0666,mode=620,nosuid,noexec devpts $R/dev/pts
	$B ln -s pts/ptmx $R/dev/ptmx
	$B ln -s /proc/self/fd $R/dev/fd
	$B ln -s /proc/self/fd/0 $R/dev/stdin
	$B ln -s /proc/self/fd/1 $R/dev/stdout
	$B ln -s /proc/self/fd/2 $R/dev/stderr
}
mount_tmpfs() {  # PATH SIZE: private scratch, as on the namespace tier
	$B mkdir -p "$R$1" && $B mount -t tmpfs -o nosuid,nodev,mode=1777,size=$2 tmpfs "$R$1" \
		|| fail "cannot mount a tmpfs on $1"
}
mount_rw() {  # TAG PATH CACHE: a writable export (the workspace...)
	$B mkdir -p "$R$2" && $B mount -t 9p \
		-o trans=virtio,version=9p2000.L,access=client,msize=@MSIZE@,cache=$3 "$1" "$R$2" \
		|| fail "cannot mount $2 ($1)"
}

# Inside the guest's root, as root: take stdin, stdout and stderr from the ports
# (the init's own stderr stays its own: it reports a command killed by a signal
# there, which is not the command's output), join the cgroup, enter the directory, find
# the program (busybox would run its own applet of the same name rather than
# search PATH, so a bare name is looked up here), then drop to the caller's
# uid and gid, no new privileges, and exec with only the request's environment.
LAUNCH='
exec 0<&5 1>&6 2>&7 5<&- 6>&- 7>&-
u=$1 g=$2 d=$3
shift 3
echo $$ >/sys/fs/cgroup/corral/cgroup.procs || exit 125
cd -- "$d" || exit 125
n=$# i=0 path= state=env
while [ $i -lt $n ]; do
	a=$1
	shift
	i=$((i + 1))
	if [ $state = env ]; then
		case $a in --) state=cmd; continue;; PATH=*) path=${a#PATH=};; esac
	elif [ $state = cmd ]; then
		state=args
		case $a in
		*/*) ;;
		*) found=$( (IFS=:; for x in $path; do x=${x:-.}; [ -f "$x/$a" ] && [ -x "$x/$a" ] \
			&& { echo "$x/$a"; exit 0; }; done; exit 1) ) \
			|| { echo "corral: $a: command not found" >&2; exit 127; }
			a=$found;;
		esac
		case $a in *=*) echo "corral: cannot run $a: its path holds =" >&2; exit 126;; esac
	fi
	set -- "$@" "$a"
done
exec /run/corral/busybox setpriv --nnp /run/corral/busybox nsenter -S "$u" -G "$g" \
	/run/corral/busybox env -i "$@"
'

run() {  # UID GID PIDS NET CWD ENV... -- ARGV...
	uid=$1 gid=$2 pids=$3 net=$4 cwd=$5
	shift 5
	[ -d "$R$cwd" ] || fail "cannot enter $cwd"
	c=$R/sys/fs/cgroup
	echo "+pids +memory" >$c/cgroup.subtree_control && $B mkdir $c/corral || fail "no cgroup"
	[ "$pids" = - ] || echo "$pids" >$c/corral/pids.max || fail "cannot bound pids"
	$B mkdir -p $R/run/corral && $B touch $R/run/corral/busybox \
		&& $B mount --bind /bin/busybox $R/run/corral/busybox \
		&& $B cp /corral/* $R/run/corral/ && $B chown "$uid:$gid" $R/run/corral \
		|| fail "cannot prepare /run/corral"
	IN=$(port corral.stdin) && OUT=$(port corral.stdout) && ERR=$(port corral.stderr) \
		|| fail "no stdio ports"
	if [ "$net" = 1 ]; then
		DOOR=$(port corral.door) || fail "no door port"
		exec 4<>$DOOR
	fi
	$B chroot $R /run/corral/busybox sh -c "$LAUNCH" corral "$uid" "$gid" "$cwd" "$@" \
		5<$IN 6>$OUT 7>$ERR 3>&-
	code=$?
	exec 4>&-
	$B kill -9 -1 2>/dev/null
	$B sync
	$B mount -t debugfs debugfs /sys/kernel/debug
	d=/sys/kernel/debug/virtio-ports
	out=$($B sed -n 's/^bytes_sent: //p' $d/${OUT##*/})
	err=$($B sed -n 's/^bytes_sent: //p' $d/${ERR##*/})
	oom=$($B sed -n 's/^oom_kill //p' $c/corral/memory.events)
	echo "exit $code ${out:-0} ${err:-0} ${oom:-0}" >&3
	$B poweroff -f
}

read -r size <&3 || fail "no request"
$B head -c "$size" <&3 >/request || fail "short request"
. /request
fail "the request did not run a command"
"""


def init_script(modules: list[str]) -> str:
    return INIT.replace("@MODULES@", " ".join(modules)).replace("@MSIZE@", str(MSIZE))


def archive(
    modules: list[tuple[str, bytes]], busybox: bytes, helpers: list[tuple[str, bytes]]
) -> bytes:
    """The initramfs: ``modules`` (name, bytes) in load order, a static ``busybox``,
    and corral's ``helpers`` (file name, bytes) in ``/corral``."""
    entries = [
        cpio.directory("bin"),
        cpio.file("bin/busybox", busybox, 0o755),
        cpio.symlink("bin/sh", "busybox"),
        cpio.directory("corral"),
        *(cpio.file(f"corral/{name}", data) for name, data in helpers),
        cpio.directory("dev"),
        cpio.directory("lib"),
        cpio.directory("lib/modules"),
        *(cpio.file(f"lib/modules/{name}.ko", data) for name, data in modules),
        cpio.directory("mnt"),
        cpio.directory("proc"),
        cpio.directory("sys"),
        cpio.file("init", init_script([name for name, _ in modules]).encode(), 0o755),
    ]
    return cpio.newc(entries)


def helper_files() -> list[tuple[str, bytes]]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # corral/
    found = []
    for package, name in HELPERS:
        with open(os.path.join(here, package, name), "rb") as fh:
            found.append((name, fh.read()))
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


def cached(assets: Assets, busybox: str, cache: str) -> str:
    """The initramfs for ``assets`` in ``cache``, built if no file of that digest is there."""
    with open(busybox, "rb") as fh:
        box = fh.read()
    modules = []
    for name in assets.modules:
        with open(assets.module_path(name), "rb") as fh:
            modules.append((name, fh.read()))
    helpers = helper_files()
    digest = hashlib.sha256(BUILD_VERSION.encode())
    digest.update(init_script(assets.modules).encode())
    for part in (box, *(d for _, d in modules), *(d for _, d in helpers)):
        digest.update(hashlib.sha256(part).digest())
    path = os.path.join(cache, f"initramfs-{digest.hexdigest()[:16]}.cpio")
    if os.path.exists(path):
        return path
    data = archive(modules, box, helpers)
    os.makedirs(cache, mode=0o700, exist_ok=True)
    work = f"{path}.tmp{os.getpid()}"
    with open(work, "wb") as fh:
        fh.write(data)
    os.rename(work, path)
    return path
