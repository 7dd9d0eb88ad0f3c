"""The microVM building blocks: QEMU ``-M microvm`` now, Firecracker where a host has it.

The ``microvm`` tier (:mod:`corral.tiers.microvm`) plans with :func:`run.build`
and launches through its strategy: a forked runner that calls
:func:`run.execute`.  ``python -m corral.vm.run -- CMD`` is the same runner on
its own (it adds ``--console``, the guest's serial console, for debugging).

Design, one module each:

* :mod:`~corral.vm.setup`: the guest kernel is Debian's ``linux-image``, from
  this host's ``/boot`` or ``apt-get download``; kept as an ELF trimmed of zero
  padding (QEMU boots it through its PVH entry: no decompressor, ~3 s less
  under TCG) and the modules Debian builds as modules but the guest needs
  (virtio-mmio, virtio console, 9p).  ``--system`` installs for every user.
  Nothing set up: a refusal naming ``python3 -m corral.vm.setup``.
* :mod:`~corral.vm.initramfs`: a newc cpio (:mod:`~corral.vm.cpio`) of the
  host's static busybox, the modules and a shell init; no Python on the
  guest's path to a command (a Python start costs 0.3-0.7 s under TCG).
  Cached by the digest of its inputs.
* :mod:`~corral.vm.guestpython`: a Sandbox's machine is the same initramfs
  plus the agent's interpreter and modules (their host paths and mtimes); its
  init starts the agent before the state is saved, and a restored agent only
  chroots into the view and takes the run's ids, cwd and environment
  (:func:`corral.agent.wait_for_go`): ~0.5 s to a ready Sandbox, not ~1.5 s.
* :mod:`~corral.vm.guest`: the filesystem decision is the fsplan's, applied on
  the *host*: QEMU runs in a bubblewrap sandbox whose mount namespace holds, at
  ``/guest``, the namespace tier's view (masks, snapshots, read-only binds), and
  exports it over 9p: ``/guest`` read-only as the guest's root, each writable
  path read-write.  The guest's root cannot undo a mask: it is not a mount in
  the guest, and QEMU (no capabilities) serves an empty mode-000 file there.
  9p over virtiofs, measured in the prototype (median of 3, TCG, busy host):
  ``python -c pass`` cold/warm 0.66/0.25 s with 9p ``cache=loose`` on the
  read-only root against 0.88/0.36 s for virtiofs ``cache=always``, and a
  five-file C build 4.1 s against 5.9 s; virtiofs also needs a daemon per
  export with privileges (Debian's ``virtiofsd`` does not start as a user),
  guest RAM as shared memory and modern virtio-mmio.  Writable exports use
  ``cache=mmap``: writes reach the host at once and shared mmap works.
* :mod:`~corral.vm.qemu`: QEMU's argv (pure): no network device at all; one
  virtio-serial port each for the control channel, stdin, stdout, stderr and,
  with a network, the door; every chardev a socket pair passed by number, so
  nothing is made on the host's filesystem.  Host facts (TSC frequency for
  ``tsc_early_khz``, the merged-/usr links) come in as arguments.
* :mod:`~corral.vm.mux`: the door.  The guest's relay connects to a unix socket
  in the guest (:mod:`~corral.vm.guestdoor`); each connection is a stream over
  the door port, and the runner opens one connection to the door's proxy per
  stream.  (A Sandbox's agent, waiting in a restored guest, serves the relay
  and that socket itself: :func:`corral.agent.wait_for_go`.)  Credit-based
  flow control per stream; a proxy that is gone closes the stream: no network.
  (Slirp's ``guestfwd`` to a unix socket is one connection for all, or a
  process per connection: rejected.)
* :mod:`~corral.vm.probe`: KVM or TCG by booting the guest once with KVM (the
  init says ``ready``), cached per host kernel, QEMU binary and guest kernel.
  Here KVM is PVM and the Debian kernel hangs: TCG, and the reason says so.
* :mod:`~corral.vm.snapshot`: the warm start.  The first boot of a machine
  (kernel, initramfs, QEMU, machine options, RAM, vCPUs, devices) saves the
  guest's state where its init waits for a request (QMP ``migrate`` into an
  unnamed ``O_TMPFILE``, named once whole); later starts run QEMU with
  ``-incoming`` from it, and the request's first line reseeds the guest's
  random generator and sets its clock (``/bin/reseed``).  No request, mount of
  the host's view or environment value is ever in a state (the guest's own
  /proc, /sys and /dev for the command's root are: made before the save, moved
  into place by the request).
* :mod:`~corral.vm.run`: the runner: plan, boot, request over the control
  port (environment values never in an argv), output read to the byte counts
  the guest's driver reports, timeout (124: the sandbox's pid 1 killed, QEMU
  with it), and nothing left: bubblewrap's ``--die-with-parent`` and pid
  namespace take QEMU along even when the runner is SIGKILLed.  For ``corral
  shell`` the command is a relay that makes the guest's own pty
  (:data:`corral.shell.TTY_RELAY`): a pty cannot cross into a guest, so corral
  shell sends its input framed, with the window size, through the stdin port.
* :mod:`~corral.vm.firecracker`: pure builders for the machine configuration,
  the jailer's argv and the tap + nftables egress; a ``health()`` that names
  every missing piece.
"""


def cache_dir() -> str:
    """This user's VM cache (kernels set up by them, the initramfs images, probe
    answers, saved states), in corral's cache (:func:`corral.runlog.cache_dir`)."""
    import os

    from corral import runlog

    return os.path.join(runlog.cache_dir(), "vm")
