"""The processes of a cgroup v2 directory named by its id: the kernel's cgroup id, which the
hooks record (bpf_get_current_cgroup_id()) and sock_diag reports per socket
(INET_DIAG_CGROUP_ID).

No walk of the tree: cgroup2 hands out file handles whose bytes are that id (kernfs'
FILEID_KERNFS handle type), so open_by_handle_at(2) opens the directory at once (it needs
CAP_DAC_READ_SEARCH, which the privileged agent has). Where the kernel refuses handles, the
hook cgroup's tree is walked once per unknown id and the paths are remembered.
cgroup.procs lists the pids as the reader's pid namespace numbers them, so this works in a
kind node as on a host.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import struct

log = logging.getLogger(__name__)

FILEID_KERNFS = 0xFE            # include/linux/exportfs.h
AT_FDCWD = -100
_HANDLE = struct.Struct("=IiQ")  # struct file_handle: handle_bytes, handle_type, the id
_REFUSED = (errno.EPERM, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)

_libc = ctypes.CDLL(None, use_errno=True)


class CgroupProcs:
    """`root`: the hook cgroup (any directory of its cgroup2 mount serves for the handles;
    the walk, where handles are refused, covers its tree)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._handles = True
        self._paths: dict[int, str] = {}
        self.walks = 0              # walks of the tree (handles refused): for the work count

    def procs(self, cgroup_id: int) -> list[int]:
        """The pids in that cgroup, [] when it is gone or not under the root."""
        fd = self._open(cgroup_id)
        if fd is None:
            return []
        try:
            cfd = os.open("cgroup.procs", os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd)
            with os.fdopen(cfd) as f:
                return [int(line) for line in f if line.strip()]
        except OSError:
            return []               # removed meanwhile
        finally:
            os.close(fd)

    def _open(self, cgroup_id: int) -> int | None:
        if self._handles:
            try:
                return self._by_handle(cgroup_id)
            except OSError as exc:
                if exc.errno in (errno.ESTALE, errno.ENOENT):
                    return None     # no such cgroup (any more)
                if exc.errno not in _REFUSED:
                    raise
                log.info("cgroup file handles refused (%s): cgroups are found by walking %s",
                         exc.strerror, self.root)
                self._handles = False
        path = self._paths.get(cgroup_id)
        if path is None or not _is(path, cgroup_id):
            self._walk()
            path = self._paths.get(cgroup_id)
        if path is None:
            return None
        try:
            return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None

    def _by_handle(self, cgroup_id: int) -> int:
        mount = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            handle = ctypes.create_string_buffer(_HANDLE.pack(8, FILEID_KERNFS, cgroup_id))
            fd = _libc.open_by_handle_at(mount, handle, os.O_RDONLY | os.O_DIRECTORY |
                                         os.O_CLOEXEC)
            if fd < 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
            return fd
        finally:
            os.close(mount)

    def _walk(self) -> None:
        self.walks += 1
        self._paths.clear()
        self._note(self.root)
        for parent, dirs, _files in os.walk(self.root, onerror=lambda e: None):
            for d in dirs:
                self._note(os.path.join(parent, d))

    def _note(self, path: str) -> None:
        try:
            self._paths[os.stat(path).st_ino] = path
        except OSError:
            pass


def _is(path: str, cgroup_id: int) -> bool:
    try:
        return os.stat(path).st_ino == cgroup_id
    except OSError:
        return False
