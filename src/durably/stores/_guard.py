"""Checks that a file or directory the store is about to trust is really the user's own.

ssh refuses a ``~/.ssh`` that another user could write; the file stores do the same
for the state directory and for every checkpoint, log and lock file in it: each must
be owned by the effective user and not writable by group or others, or the store
refuses it (``UnsafePath``, naming the path, its owner and its mode). Without this
another local user who could write a file there (a ``runs/`` made 0777, a planted
checkpoint) could make this user's agent carry on a run they forged.

Files are opened with ``O_NONBLOCK`` and checked with ``fstat`` on the descriptor
(never a second lookup of the name), so a FIFO or a device at a checkpoint's name is
refused at once instead of blocking the reader forever.
"""

from __future__ import annotations

import os
import pwd
import stat

from .._sysio import FileSystem
from ..errors import UnsafePath

__all__ = [
    "check_parents",
    "check_trusted",
    "describe_kind",
    "make_private_directories",
    "open_trusted",
    "owner_name",
]

_NONBLOCK = os.O_NONBLOCK
_NOFOLLOW = os.O_NOFOLLOW


def owner_name(uid: int) -> str:
    """``uid (name)``, or the bare number when the user has no name."""
    try:
        return f"{uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return str(uid)


def check_trusted(info: os.stat_result, *, path: str, directory: bool = False) -> None:
    """Refuse what is not a regular file (or a directory), not ours, or writable by others.

    Raises:
        UnsafePath: naming the path, the owner and the mode, and how to fix it.
    """
    kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    if not kind_ok:
        wanted = "a directory" if directory else "a regular file"
        raise UnsafePath(path=path, reason=f"it is not {wanted} ({describe_kind(info.st_mode)})")
    me = os.geteuid()
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != me or mode & 0o022:
        raise UnsafePath(
            path=path,
            reason=(
                f"it is owned by uid {owner_name(info.st_uid)} with mode {mode:04o}; durably "
                f"trusts only what uid {owner_name(me)} owns and no group or other user can "
                f"write (as ssh does); if it is yours: chown {me} {path}; chmod go-w {path}"
            ),
        )


def check_parents(path: str | os.PathLike[str]) -> None:
    """Refuse a state directory whose parents another user could swap it out of.

    Whoever can rename entries in a directory above the state directory can put a
    directory of their own in its place. So, as sudo checks a file's parents up to
    ``/``, each existing parent of ``path`` (its symlinks resolved) must be owned by
    root or by this user, and must not be writable by group or others unless it is
    sticky (``/tmp``: there only an entry's owner can rename it, and the entry below
    it is checked in its turn: a parent by this rule, the state directory by
    :func:`check_trusted`). Parents that do not exist yet are made 0700.

    Raises:
        UnsafePath: naming the parent, its owner and its mode, and what to do.
    """
    me = os.geteuid()
    current = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    while True:
        try:
            info = os.stat(current)
        except FileNotFoundError:
            info = None  # made by the store, 0700
        if info is not None:
            mode = stat.S_IMODE(info.st_mode)
            foreign = info.st_uid not in (0, me)
            open_to_others = mode & 0o022 and not mode & stat.S_ISVTX
            if foreign or open_to_others:
                raise UnsafePath(
                    path=current,
                    reason=(
                        f"it is a parent of the state directory {os.fspath(path)}, owned by "
                        f"uid {owner_name(info.st_uid)} with mode {mode:04o}: whoever owns it "
                        "or can write it can swap the state directory for their own; durably "
                        f"trusts parents owned by root or uid {owner_name(me)} that no group "
                        "or other user can write unless sticky (as /tmp); move the state "
                        f"directory, or if it is yours: chmod go-w {current}"
                    ),
                )
        parent = os.path.dirname(current)
        if parent == current:
            return
        current = parent


def open_trusted(
    fs: FileSystem, name: str, flags: int, mode: int, *, dir_fd: int, path: str
) -> int:
    """Open ``name`` (never through a symlink, never blocking) and check it is ours.

    ``OSError`` from the open itself (no such file, a symlink: ``ELOOP``) is the
    caller's to translate.
    """
    fd = fs.open(name, flags | _NOFOLLOW | _NONBLOCK, mode, dir_fd=dir_fd)
    try:
        check_trusted(os.fstat(fd), path=path)
    except BaseException:
        fs.close(fd)
        raise
    return fd


def make_private_directories(path: str | os.PathLike[str]) -> None:
    """Make ``path`` and its missing parents, each exactly 0700 whatever the umask.

    An existing directory is left as it is (it is checked where it is trusted).
    """
    missing = []
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        missing.append(current)
        current = os.path.dirname(current)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue
        os.chmod(directory, 0o700, follow_symlinks=False)  # a umask only ever removes bits


def describe_kind(mode: int) -> str:
    """What a file of this mode is, for a message: ``a FIFO``, ``a directory``..."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"
