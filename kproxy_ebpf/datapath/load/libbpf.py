"""Thin ctypes bindings to libbpf's low-level API (libbpf.so.1, which bcc itself links).

Why not bcc's Table: reading pinned maps must not need a compile (the CLI runs in ~0.1 s and on
a node without kernel headers), and the writer wants batch updates and typed errors. Why not
raw syscalls: libbpf already builds every bpf_attr correctly for the running kernel.

libbpf >= 1.0 returns -errno from these calls; every failure becomes a BpfError with that errno.
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct
from functools import lru_cache

# enum bpf_attach_type values (include/uapi/linux/bpf.h); stable kernel ABI.
ATTACH_CGROUP_INET4_CONNECT = 10
ATTACH_CGROUP_UDP4_SENDMSG = 14
ATTACH_CGROUP_UDP4_RECVMSG = 19
ATTACH_CGROUP_INET4_GETPEERNAME = 29
ATTACH_CGROUP_INET6_CONNECT = 11
ATTACH_CGROUP_UDP6_SENDMSG = 15
ATTACH_CGROUP_UDP6_RECVMSG = 20
ATTACH_CGROUP_INET6_GETPEERNAME = 30
ATTACH_CGROUP_INET_SOCK_RELEASE = 34
ATTACH_TCX_INGRESS = 46         # kernel 6.6+ (tcx.py)
ATTACH_TCX_EGRESS = 47
F_BEFORE = 1 << 3               # BPF_F_BEFORE: with no relative program, first of all

BPF_ANY = 0
BPF_NOEXIST = 1


class BpfError(OSError):
    """A libbpf call failed; .errno tells why (E2BIG: map full, ENOENT: no such key)."""

    done: int       # set by the batch calls only: entries processed before the failing one


class _MapInfo(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32), ("name", ctypes.c_char * 16),
        ("_rest", ctypes.c_uint8 * 48),
    ]


class _LinkInfo(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("prog_id", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32), ("cgroup_id", ctypes.c_uint64),
        ("attach_type", ctypes.c_uint32), ("_rest", ctypes.c_uint8 * 36),
    ]


class _LinkCreateOpts(ctypes.Structure):
    """struct bpf_link_create_opts up to `flags`: libbpf treats the fields after sz as zero
    (for tcx: no relative program, any revision), in 1.1 as in 1.3+."""
    _fields_ = [("sz", ctypes.c_size_t), ("flags", ctypes.c_uint32)]


class TestRunOpts(ctypes.Structure):
    """struct bpf_test_run_opts (libbpf 1.x); sz tells libbpf which fields we know."""
    _fields_ = [
        ("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_void_p), ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32), ("repeat", ctypes.c_int), ("duration", ctypes.c_uint32),
        ("flags", ctypes.c_uint32), ("cpu", ctypes.c_int), ("batch_size", ctypes.c_uint32),
    ]


@lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    # Explicitly version 1: libbpf 0.x returns -1 and sets errno where 1.x returns -errno,
    # which every check below relies on.
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    vp, c_int, c_uint = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
    sigs = {
        "bpf_obj_get": ([ctypes.c_char_p], c_int),
        "bpf_obj_pin": ([c_int, ctypes.c_char_p], c_int),
        "bpf_map_lookup_elem": ([c_int, vp, vp], c_int),
        "bpf_map_update_elem": ([c_int, vp, vp, ctypes.c_uint64], c_int),
        "bpf_map_delete_elem": ([c_int, vp], c_int),
        "bpf_map_get_next_key": ([c_int, vp, vp], c_int),
        "bpf_obj_get_info_by_fd": ([c_int, vp, ctypes.POINTER(ctypes.c_uint32)], c_int),
        "bpf_link_create": ([c_int, c_int, c_uint, vp], c_int),
        "bpf_link_detach": ([c_int], c_int),
        "bpf_link_get_fd_by_id": ([ctypes.c_uint32], c_int),
        "bpf_prog_get_fd_by_id": ([ctypes.c_uint32], c_int),
        "bpf_link_update": ([c_int, c_int, vp], c_int),
        "bpf_map_lookup_batch": ([c_int, vp, vp, vp, vp, ctypes.POINTER(ctypes.c_uint32), vp],
                                 c_int),
        "bpf_prog_test_run_opts": ([c_int, ctypes.POINTER(TestRunOpts)], c_int),
        "bpf_map_update_batch": ([c_int, vp, vp, ctypes.POINTER(ctypes.c_uint32), vp], c_int),
        "bpf_map_delete_batch": ([c_int, vp, ctypes.POINTER(ctypes.c_uint32), vp], c_int),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = -ret if ret != -1 else (ctypes.get_errno() or errno.EIO)
        raise BpfError(err, f"{what}: {os.strerror(err)}")
    return ret


def _ptr(buf):
    """A map key or value for libbpf: packed bytes as they are (the writer's rows, encoded
    without a ctypes object each), a ctypes object by reference."""
    return buf if isinstance(buf, bytes) else ctypes.byref(buf)


def obj_get(path: str) -> int:
    """Opens a pinned map, program or link; returns its fd."""
    return _check(_lib().bpf_obj_get(path.encode()), f"open pinned {path}")


def obj_pin(fd: int, path: str) -> None:
    _check(_lib().bpf_obj_pin(fd, path.encode()), f"pin {path}")


def map_lookup(fd: int, key: ctypes.Structure | ctypes._SimpleCData, value) -> bool:
    ret = _lib().bpf_map_lookup_elem(fd, ctypes.byref(key), ctypes.byref(value))
    if ret == -errno.ENOENT:
        return False
    _check(ret, "map lookup")
    return True


def map_update(fd: int, key, value, flags: int = BPF_ANY) -> None:
    _check(_lib().bpf_map_update_elem(fd, _ptr(key), _ptr(value), flags), "map update")


def map_delete(fd: int, key) -> bool:
    ret = _lib().bpf_map_delete_elem(fd, _ptr(key))
    if ret == -errno.ENOENT:
        return False
    _check(ret, "map delete")
    return True


def map_next_key(fd: int, key, next_key) -> bool:
    """Writes the key after `key` (the first one when key is None); False at the end."""
    ret = _lib().bpf_map_get_next_key(fd, ctypes.byref(key) if key is not None else None,
                                      ctypes.byref(next_key))
    if ret == -errno.ENOENT:
        return False
    _check(ret, "map iterate")
    return True


def obj_info(fd: int, info: ctypes.Structure, what: str):
    """BPF_OBJ_GET_INFO_BY_FD into `info`, a prefix of the kernel's struct."""
    size = ctypes.c_uint32(ctypes.sizeof(info))
    _check(_lib().bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)), what)
    return info


def map_lookup_batch(fd: int, token: ctypes.Array | None, next_token: ctypes.Array,
                     keys: ctypes.Array, values: ctypes.Array,
                     capacity: int | None = None) -> tuple[int, bool]:
    """Reads up to len(keys) entries after `token` (None: from the start) in one syscall.
    Returns (entries read, whether the map is exhausted). ~0.5 us per entry instead of ~10 us
    for a get-next-key plus a lookup each. `capacity`: entries the buffers hold, when they
    are raw bytes rather than arrays of the key and value types."""
    count = ctypes.c_uint32(len(keys) if capacity is None else capacity)
    ret = _lib().bpf_map_lookup_batch(fd, ctypes.byref(token) if token is not None else None,
                                      ctypes.byref(next_token), ctypes.byref(keys),
                                      ctypes.byref(values), ctypes.byref(count), None)
    if ret == -errno.ENOENT:
        return count.value, True
    _check(ret, "map batch lookup")
    return count.value, False


def map_update_batch(fd: int, keys: ctypes.Array | bytes, values: ctypes.Array | bytes,
                     count: int | None = None) -> int:
    """Writes `count` (default len(keys)) entries in one syscall (BPF_MAP_UPDATE_BATCH,
    element by element in array order); keys and values are arrays of the map's types or
    their packed bytes back to back. Returns how many were written; raises BpfError (with
    .done) on failure."""
    n = ctypes.c_uint32(len(keys) if count is None else count)
    return _batch_done(_lib().bpf_map_update_batch(fd, _ptr(keys), _ptr(values),
                                                   ctypes.byref(n), None), n, "update")


def map_delete_batch(fd: int, keys: ctypes.Array | bytes, count: int | None = None) -> int:
    """Deletes `count` (default len(keys)) entries in one syscall, in array order; a missing
    key stops it (BpfError with .done = entries deleted before it)."""
    n = ctypes.c_uint32(len(keys) if count is None else count)
    return _batch_done(_lib().bpf_map_delete_batch(fd, _ptr(keys), ctypes.byref(n), None), n,
                       "delete")


def _batch_done(ret: int, count: ctypes.c_uint32, what: str) -> int:
    """Entries a batch call processed; on failure a BpfError whose .done says how many."""
    if ret < 0:
        err = BpfError(-ret, f"map batch {what}: {os.strerror(-ret)}")
        err.done = count.value
        raise err
    return count.value


def map_info(fd: int) -> _MapInfo:
    return obj_info(fd, _MapInfo(), "map info")


def link_info(fd: int) -> _LinkInfo:
    return obj_info(fd, _LinkInfo(), "link info")


def link_create(prog_fd: int, target_fd: int, attach_type: int, flags: int = 0) -> int:
    """Attaches a program through a BPF link (which a pin keeps alive after we exit). For
    tcx, target_fd is the ifindex."""
    opts = _LinkCreateOpts(sz=ctypes.sizeof(_LinkCreateOpts), flags=flags)
    return _check(_lib().bpf_link_create(prog_fd, target_fd, attach_type, ctypes.byref(opts)),
                  "link create")


def prog_get_fd_by_id(prog_id: int) -> int:
    return _check(_lib().bpf_prog_get_fd_by_id(prog_id), "prog by id")


def link_get_fd_by_id(link_id: int) -> int:
    return _check(_lib().bpf_link_get_fd_by_id(link_id), "link by id")


def link_update(link_fd: int, new_prog_fd: int) -> None:
    """Swaps the program behind a link atomically: no connect or packet sees no program."""
    _check(_lib().bpf_link_update(link_fd, new_prog_fd, None), "link update")


def link_detach(link_fd: int) -> None:
    """Detaches a link now, whoever holds it; its pins stay, defunct."""
    _check(_lib().bpf_link_detach(link_fd), "link detach")


def prog_test_run(prog_fd: int, data: bytes) -> tuple[int, bytes]:
    """Runs a program once on `data` (BPF_PROG_TEST_RUN); returns (its return value, the
    data as the program left it). For tests that drive BPF code without real traffic."""
    inp = ctypes.create_string_buffer(data, len(data))
    out = ctypes.create_string_buffer(len(data) + 256)
    opts = TestRunOpts(sz=ctypes.sizeof(TestRunOpts), data_in=ctypes.addressof(inp),
                       data_out=ctypes.addressof(out), data_size_in=len(data),
                       data_size_out=len(out), repeat=1)
    _check(_lib().bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts)), "prog test run")
    return opts.retval, out.raw[:opts.data_size_out]


class MapCreateOpts(ctypes.Structure):
    """struct bpf_map_create_opts (libbpf 1.x)."""
    _fields_ = [
        ("sz", ctypes.c_size_t), ("btf_fd", ctypes.c_uint32),
        ("btf_key_type_id", ctypes.c_uint32), ("btf_value_type_id", ctypes.c_uint32),
        ("btf_vmlinux_value_type_id", ctypes.c_uint32), ("inner_map_fd", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32), ("map_extra", ctypes.c_uint64),
        ("numa_node", ctypes.c_uint32), ("map_ifindex", ctypes.c_uint32),
    ]


class ProgLoadOpts(ctypes.Structure):
    """struct bpf_prog_load_opts (libbpf 1.1; sz tells newer libbpf which fields we know)."""
    _fields_ = [
        ("sz", ctypes.c_size_t), ("attempts", ctypes.c_int),
        ("expected_attach_type", ctypes.c_uint32), ("prog_btf_fd", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32), ("prog_ifindex", ctypes.c_uint32),
        ("kern_version", ctypes.c_uint32), ("attach_btf_id", ctypes.c_uint32),
        ("attach_btf_obj_fd", ctypes.c_uint32), ("attach_prog_fd", ctypes.c_int),
        ("func_info", ctypes.c_void_p), ("func_info_cnt", ctypes.c_uint32),
        ("func_info_rec_size", ctypes.c_uint32), ("line_info", ctypes.c_void_p),
        ("line_info_cnt", ctypes.c_uint32), ("line_info_rec_size", ctypes.c_uint32),
        ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_char_p),
    ]


class VerifierRejected(BpfError):
    """bpf_prog_load failed; .log holds the verifier's log (its tail when it was longer)."""

    log: str


def map_create(map_type: int, name: str, key_size: int, value_size: int, max_entries: int,
               flags: int = 0, btf: bool = False) -> int:
    """Creates a map (BPF_MAP_CREATE); returns its fd. btf=True describes the key and value
    to the kernel (btf_int_key_blob), which socket storage maps require."""
    lib = _lib()
    fn = lib.bpf_map_create
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32,
                   ctypes.c_uint32, ctypes.POINTER(MapCreateOpts)]
    fn.restype = ctypes.c_int
    opts = MapCreateOpts(sz=ctypes.sizeof(MapCreateOpts), map_flags=flags)
    btf_fd = -1
    if btf:
        btf_fd = btf_load(btf_int_key_blob(value_size))
        opts.btf_fd, opts.btf_key_type_id, opts.btf_value_type_id = btf_fd, 1, 3
    try:
        return _check(fn(map_type, name.encode(), key_size, value_size, max_entries,
                         ctypes.byref(opts)), f"create map {name}")
    finally:
        if btf_fd >= 0:
            os.close(btf_fd)      # the map holds its own reference


_BTF_TYPE = struct.Struct("<III")   # name_off, info (kind << 24 | vlen), size or type


def btf_int_key_blob(value_size: int) -> bytes:
    """The smallest BTF for a map keyed by a C int whose value is `value_size` bytes: type 1
    int, type 2 unsigned char, type 3 unsigned char[value_size] (include/uapi/linux/btf.h)."""
    int_kind, array_kind, signed = 1, 3, 1
    strings = b"\0int\0unsigned char\0"
    types = (_BTF_TYPE.pack(1, int_kind << 24, 4) + struct.pack("<I", signed << 24 | 32)
             + _BTF_TYPE.pack(5, int_kind << 24, 1) + struct.pack("<I", 8)
             + _BTF_TYPE.pack(0, array_kind << 24, 0) + struct.pack("<III", 2, 1, value_size))
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types),
                         len(strings))
    return header + types + strings


def btf_load(blob: bytes) -> int:
    """Loads BTF (BPF_BTF_LOAD); returns its fd."""
    fn = _lib().bpf_btf_load
    fn.argtypes, fn.restype = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p], ctypes.c_int
    return _check(fn(blob, len(blob), None), "load BTF")


LOG_SIZE = 4 << 20


def prog_load(prog_type: int, name: str, license_: str, insns: bytes,
              expected_attach_type: int = 0, kern_version: int = 0) -> int:
    """Loads a program (BPF_PROG_LOAD) from its raw instructions; returns its fd. A rejection
    is retried once with a verifier log (not on the fast path: logging slows the verifier)."""
    fn = _lib().bpf_prog_load
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                   ctypes.c_size_t, ctypes.POINTER(ProgLoadOpts)]
    fn.restype = ctypes.c_int

    def load(log_buf=None) -> int:
        opts = ProgLoadOpts(sz=ctypes.sizeof(ProgLoadOpts),
                            expected_attach_type=expected_attach_type, kern_version=kern_version)
        if log_buf is not None:
            opts.log_level, opts.log_size = 1, len(log_buf)
            opts.log_buf = ctypes.cast(log_buf, ctypes.c_char_p)
        return fn(prog_type, name.encode(), license_.encode(), insns, len(insns) // 8,
                  ctypes.byref(opts))

    ret = load()
    if ret >= 0:
        return ret
    buf = ctypes.create_string_buffer(LOG_SIZE)
    ret = load(buf)
    if ret >= 0:        # passed with a log: take it (the first failure was transient)
        return ret
    err = VerifierRejected(-ret, f"load program {name}: {os.strerror(-ret)}")
    err.log = buf.value.decode(errors="replace")
    raise err
