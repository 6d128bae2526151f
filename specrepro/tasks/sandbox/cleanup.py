"""Scratch directories no program can turn against their clean-up.

Each run gets a parent directory made by this process (mode 0711, not sticky) and, inside it, the
program's scratch directory, owned by the program's uid. The program can fill its scratch directory but
cannot rename or replace it: the parent is not writable by its uid. Removal walks the tree by directory
descriptors, opening only directories, with O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK (a FIFO, socket, device or
symlink is unlinked, never opened or followed), and gives up at a deadline instead of hanging.
"""

from __future__ import annotations

import errno
import os
import secrets
import tempfile
import time

DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
DEADLINE_SECONDS = 5.0  # the longest one run's clean-up may take


def make_scratch(uid: int | None) -> tuple[str, str]:
    """(parent, scratch): a fresh parent only this user may write, and the program's directory inside it."""
    parent = tempfile.mkdtemp(prefix="specrepro-run-")
    os.chmod(parent, 0o711)  # others may pass through to their own directory, not list or rename it
    scratch = os.path.join(parent, f"specrepro-sandbox-{secrets.token_hex(6)}")
    os.mkdir(scratch, 0o700)
    if uid is not None:
        os.chown(scratch, uid, uid)
    return parent, scratch


def write_file(directory: str, name: str, text: str, uid: int | None) -> str:
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def _open_directory(name: str, dir_fd: int) -> int:
    try:
        return os.open(name, DIRECTORY_FLAGS, dir_fd=dir_fd)
    except PermissionError:  # a directory the program made unreadable (only matters when not root)
        os.chmod(name, 0o700, dir_fd=dir_fd)
        return os.open(name, DIRECTORY_FLAGS, dir_fd=dir_fd)


def _unlink(name: str, dir_fd: int) -> bool:
    """Unlink a non-directory; False if ``name`` is a directory."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except IsADirectoryError:
        return False
    except PermissionError as error:  # Linux says EISDIR, some file systems EPERM, for a directory
        if error.errno != errno.EPERM:
            raise
        return False
    except FileNotFoundError:
        pass
    return True


def remove_tree(path: str, deadline: float) -> bool:
    """Remove ``path`` and everything under it without following links or opening anything but
    directories; False (the rest left in place) if ``deadline`` (time.monotonic()) passes first."""
    head, name = os.path.split(os.path.abspath(path))
    top = os.open(head, DIRECTORY_FLAGS & ~os.O_NOFOLLOW)
    stack = [(top, name, None)]  # (parent fd, entry name, the entry's own fd once opened)
    try:
        while stack:
            if time.monotonic() > deadline:
                return False
            parent, name, fd = stack[-1]
            if fd is None:
                try:
                    if _unlink(name, parent):
                        stack.pop()
                        continue
                    fd = _open_directory(name, parent)
                except FileNotFoundError:
                    stack.pop()
                    continue
                except NotADirectoryError:  # replaced by a non-directory meanwhile: the next pass unlinks it
                    continue
                stack[-1] = (parent, name, fd)
            entries = os.listdir(fd)
            if entries:
                stack.extend((fd, entry, None) for entry in entries)
                continue
            stack.pop()
            os.close(fd)
            try:
                os.rmdir(name, dir_fd=parent)
            except FileNotFoundError:
                pass
            except OSError as error:
                if error.errno != errno.ENOTEMPTY:
                    raise
                stack.append((parent, name, None))  # refilled meanwhile: walk it again
        return True
    finally:
        for _, _, fd in stack:
            if fd is not None:
                os.close(fd)
        os.close(top)
