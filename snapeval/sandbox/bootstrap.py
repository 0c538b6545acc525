"""The sandbox's bootstrap: run by :mod:`snapeval.sandbox` between ``unshare`` and the program.

It is executed as a script (``python -I -S -c <this file's text> ARGS``), standard library only. It
first joins the run's memory cgroup, if the harness made one. In a private mount namespace it builds
the program's root from an allow-list instead of showing it the machine: a fresh tmpfs holding the
program's private ``/tmp`` and working folder (``work``, a tmpfs capped at ``disk`` bytes, holding
``main.py``), then read-only bind mounts of the system libraries and the interpreter (``allowed``),
mounted after the private folders so that an interpreter living under ``/tmp`` or ``/work`` is bound
into them, never hidden by them; ``/dev/{null,zero,random,urandom,full}`` and a private ``/proc``;
then it ``chroot``s into it. Only the allowed paths are bound, not their parents' other files:
benchmark data, results databases, home directories, the project (even around a venv inside it),
other sandboxes' folders and filesystem sockets do not exist for the program. Then it drops every
capability, sets ``no_new_privs``, switches to ``uid``, applies the resource limits and execs the
interpreter. Setup errors (naming the step, the path and the errno) go to the ``report`` pipe
(closed on exec), so a broken sandbox is never scored as a failing program.
"""

import ctypes
import os
import re
import resource
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_PRIVATE = 1 << 18
LOCKED_FLAGS = {
    "nosuid": 2,
    "nodev": 4,
    "noexec": 8,
    "noatime": 1024,
    "nodiratime": 2048,
    "relatime": 1 << 21,
    "strictatime": 1 << 24,
}
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
DEVICES = ("null", "zero", "random", "urandom", "full")
libc = ctypes.CDLL(None, use_errno=True)


def check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(target, flags, source=None, fstype=None, data=None):
    encoded = [None if v is None else v.encode() for v in (source, fstype, data)]
    if flags & MS_REMOUNT:
        what = f"remount {target} read-only" if flags & MS_RDONLY else f"remount {target}"
    elif fstype or source:
        what = f"mount {fstype} on {target}" if fstype else f"bind {source} on {target}"
    else:
        what = f"make {target} private"
    check(libc.mount(encoded[0], target.encode(), encoded[1], flags, encoded[2]), what)


def make_dirs(path):
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise OSError(exc.errno, f"create {path}: {exc.strerror}") from None


def bind_read_only(source, target):
    if os.path.isdir(source):
        make_dirs(target)
    else:
        make_dirs(os.path.dirname(target))
        open(target, "a").close()
    mount(target, MS_BIND | MS_REC, source=source)
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    for fields in mounts:  # the bind and every mount below it, keeping flags the kernel has locked
        path = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4])
        if path == target or path.startswith(target + "/"):
            locked = MS_NOSUID | sum(LOCKED_FLAGS.get(option, 0) for option in fields[5].split(","))
            mount(path, MS_REMOUNT | MS_BIND | MS_RDONLY | locked)


def confined_root(root, allowed, work, disk, owner):
    """Build the allow-listed root at ``root`` (the program's host folder) and chroot into it."""
    mount("/", MS_REC | MS_PRIVATE)  # nothing below ever reaches the host's mount table
    with open(os.path.join(root, "main.py"), "rb") as f:
        program = f.read()
    mount(root, 0, "tmpfs", "tmpfs", "size=8m,mode=0755")
    for folder, size, mode in (("/tmp", 16 << 20, "1777"), (work, disk, "0700")):
        make_dirs(root + folder)
        mount(root + folder, MS_NOSUID | MS_NODEV, "tmpfs", "tmpfs", f"size={size},mode={mode}")
    with open(root + work + "/main.py", "wb") as f:
        f.write(program)
    if owner != "-":
        for path in (root + work, root + work + "/main.py"):
            os.chown(path, int(owner), int(owner))
    for path in allowed:
        if os.path.islink(path):  # /bin -> usr/bin on merged-/usr systems
            make_dirs(os.path.dirname(root + path))
            os.symlink(os.readlink(path), root + path)
        elif os.path.exists(path):
            bind_read_only(path, root + path)
    for device in DEVICES:
        if os.path.exists(f"/dev/{device}"):
            bind_read_only(f"/dev/{device}", f"{root}/dev/{device}")
    make_dirs(root + "/proc")
    mount(root + "/proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "proc", "proc")
    mount(root, MS_REMOUNT | MS_RDONLY, "tmpfs", "tmpfs")
    os.chroot(root)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        for cap in range(int(f.read()) + 1):
            check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop capabilities")


def main(
    report,
    cgroup,
    workdir,
    namespaces,
    uid,
    address_space,
    processes,
    file_size,
    cpu,
    disk,
    allowed,
    work,
    python,
):
    os.set_inheritable(report, False)
    os.write(report, b"\0")
    if cgroup != "-":  # join the run's memory cgroup first: every process after this is inside it
        try:
            with open(cgroup, "w") as f:
                f.write("0")
        except OSError as exc:
            raise OSError(exc.errno, f"join cgroup {cgroup}: {exc.strerror}") from None
    program = os.path.join(workdir, "main.py")
    if namespaces == "1":
        confined_root(workdir, allowed.split(os.pathsep), work, int(disk), uid)
        workdir, program = work, work + "/main.py"
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if uid != "-":
        os.setgroups([])
        os.setgid(int(uid))
        os.setuid(int(uid))
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if address_space != "-":
        resource.setrlimit(resource.RLIMIT_AS, (int(address_space), int(address_space)))
    for limit, value in (
        (resource.RLIMIT_NPROC, processes),
        (resource.RLIMIT_FSIZE, file_size),
        (resource.RLIMIT_CORE, "0"),
    ):
        resource.setrlimit(limit, (int(value), int(value)))
    resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu) + 1))
    os.chdir(workdir)
    try:
        os.execv(python, [python, "-I", program])
    except OSError as exc:
        raise OSError(exc.errno, f"exec {python}: {exc.strerror}") from None


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]), *sys.argv[2:])
    except BaseException as exc:
        os.write(int(sys.argv[1]), f"{type(exc).__name__}: {exc}".encode())
        os._exit(125)
