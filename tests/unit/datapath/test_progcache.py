"""The compiled-program cache (datapath/progcache.py): its key follows every input of a compile,
map fds are recorded by map and substituted on load, and every problem with an entry is a
CacheMiss with a reason (the load child then compiles), never a crash or a half load."""
import json
import os
import struct

import pytest

from kproxy_ebpf.datapath.load import compile_child, libbpf, progcache, progload
from kproxy_ebpf.datapath.load.progcache import CacheMiss
from kproxy_ebpf.datapath.maps.map_sizes import MapSizes

INSN = struct.Struct("<BBhi")


def insn(code, dst=0, src=0, off=0, imm=0) -> bytes:
    return INSN.pack(code, (src << 4) | dst, off, imm)


def ld_map(fd, dst=1, src=progcache.PSEUDO_MAP_FD) -> bytes:
    return insn(0x18, dst, src, 0, fd) + insn(0)       # ld_imm64 is two slots


MOV = insn(0xb7, 0, 0, 0, 1)       # r0 = 1
EXIT = insn(0x95)
PROG = MOV + ld_map(7) + MOV + ld_map(9, dst=2) + ld_map(7) + EXIT


# -- the key -----------------------------------------------------------------------------------
@pytest.fixture
def bpf_root(tmp_path):
    root = tmp_path / "bpf"
    (root / "lib").mkdir(parents=True)
    (root / "sock_lb.c").write_text("int x;\n")
    (root / "lib" / "lb.h").write_text("#define A 1\n")
    return root


def key(root, cflags=("-DKP_SVC4_SIZE=1",), progs=({"name": "kp_connect4"},), headers="h",
        kernel="6.1.0", bcc="0.26.0"):
    return progcache.cache_key(progcache.key_inputs(root, list(cflags), list(progs), headers,
                                                    kernel, bcc))


def test_the_key_is_stable_for_the_same_inputs(bpf_root):
    assert key(bpf_root) == key(bpf_root)


@pytest.mark.parametrize("change", [
    lambda r: (r / "lib" / "lb.h").write_text("#define A 2\n"),      # an included header
    lambda r: (r / "lib" / "new.h").write_text(""),                   # a new file under bpf/
])
def test_any_file_under_bpf_changes_the_key(bpf_root, change):
    before = key(bpf_root)
    change(bpf_root)
    assert key(bpf_root) != before


@pytest.mark.parametrize("other", [
    {"cflags": ("-DKP_SVC4_SIZE=2",)}, {"progs": ({"name": "kp_connect6"},)},
    {"headers": "other-tree"}, {"kernel": "6.12.0"}, {"bcc": "0.31.0"},
])
def test_flags_programs_headers_kernel_and_bcc_change_the_key(bpf_root, other):
    assert key(bpf_root, **other) != key(bpf_root)


def test_layout_specs_change_the_key(bpf_root, monkeypatch):
    before = key(bpf_root)
    monkeypatch.setitem(progcache.G.MAPS["svc"], "flags", 1)
    assert key(bpf_root) != before


def test_the_request_key_ignores_the_pin_directory_and_follows_map_sizes():
    progs = [{"name": "kp_connect4"}]
    base = compile_child.cache_inputs(progs, MapSizes())
    assert not any("KP_PIN_DIR" in f for f in base["cflags"])
    assert progcache.cache_key(compile_child.cache_inputs(progs, MapSizes(svc=1024))) != \
        progcache.cache_key(base)


def test_bcc_version_is_read_without_importing_bcc():
    # In a fresh interpreter: another test of the session may have imported bcc already.
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c",
                          "import sys; from kproxy_ebpf.datapath.load import progcache; "
                          "print(progcache.bcc_version(), 'bcc' in sys.modules)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] not in ("", "None") and out[1] == "False"


# -- map references ----------------------------------------------------------------------------
def test_map_references_are_recorded_by_map_and_relocated_to_new_fds():
    refs = progcache.map_refs(PROG, {7: "svc", 9: "backend"})
    assert refs == [[1, "svc"], [4, "backend"], [6, "svc"]]
    out = progcache.relocate(PROG, refs, {"svc": 31, "backend": 32})
    assert len(out) == len(PROG)
    assert [INSN.unpack_from(out, i * 8)[3] for i in (1, 4, 6)] == [31, 32, 31]
    # nothing else moved: the other instructions and the ld_imm64 second halves
    for i in (0, 2, 3, 5, 7, 8):
        assert out[i * 8:(i + 1) * 8] == PROG[i * 8:(i + 1) * 8]


def test_an_unknown_fd_or_another_pseudo_load_is_not_cacheable():
    with pytest.raises(CacheMiss, match="fd 9, not a kproxy map"):
        progcache.map_refs(PROG, {7: "svc"})
    with pytest.raises(CacheMiss, match="src 2"):        # BPF_PSEUDO_MAP_VALUE (global data)
        progcache.map_refs(MOV + ld_map(7, src=2) + EXIT, {7: "svc"})
    with pytest.raises(CacheMiss, match="whole instructions"):
        progcache.map_refs(PROG[:-3], {7: "svc", 9: "backend"})


def test_an_entry_pointing_at_no_map_load_is_corrupt():
    with pytest.raises(CacheMiss, match="corrupt"):
        progcache.relocate(PROG, [[0, "svc"]], {"svc": 3})


# -- entries and every fallback ------------------------------------------------------------------
def record(name="kp_connect4"):
    return {"name": name, "prog_type": 18, "attach_type": 10, "license": "GPL",
            "kern_version": 0, "insns": PROG, "refs": [[1, "svc"], [4, "backend"], [6, "svc"]]}


def test_an_entry_round_trips(tmp_path):
    path = progcache.store(tmp_path, "k1", {"x": 1}, [record()])
    assert path == tmp_path / "k1.json" and not list(tmp_path.glob(".*"))
    assert progcache.read(tmp_path, "k1", ["kp_connect4"])["kp_connect4"]["insns"] == PROG


def test_no_entry_is_an_expected_miss(tmp_path):
    with pytest.raises(CacheMiss, match="no entry") as exc:
        progcache.read(tmp_path, "k1", ["kp_connect4"])
    assert exc.value.expected


@pytest.mark.parametrize("text, reason", [
    ("{not json", "unreadable"),
    (json.dumps({"key": "other", "programs": []}), "holds key"),
    (json.dumps({"key": "k1"}), "corrupt"),
    (json.dumps({"key": "k1", "programs": [{"name": "kp_connect4", "insns": "!!"}]}), "corrupt"),
    (json.dumps({"key": "k1", "programs": []}), "lacks kp_connect4"),
])
def test_a_bad_entry_is_an_unexpected_miss(tmp_path, text, reason):
    (tmp_path / "k1.json").write_text(text)
    with pytest.raises(CacheMiss, match=reason) as exc:
        progcache.read(tmp_path, "k1", ["kp_connect4"])
    assert not exc.value.expected


@pytest.fixture
def fake_kernel(monkeypatch, tmp_path):
    """open_maps and prog_load without a kernel: fds of /dev/null, so a leak shows."""
    opened = []

    def devnull():
        fd = os.open(os.devnull, os.O_RDONLY)
        opened.append(fd)
        return fd

    monkeypatch.setattr(progcache, "open_maps",
                        lambda bpffs, sizes: {"svc": devnull(), "backend": devnull()})
    loaded = []

    def prog_load(prog_type, name, lic, insns, attach, kver):
        loaded.append((name, insns))
        if name == "kp_connect6":
            err = libbpf.VerifierRejected(13, "load program: Permission denied")
            err.log = "0: (b7) r0 = 1\n1: invalid mem access 'scalar'\nprocessed 2 insns\n"
            raise err
        return devnull()

    monkeypatch.setattr(progcache.libbpf, "prog_load", prog_load)
    progcache.store(tmp_path, "k1", {}, [record("kp_connect4"), record("kp_connect6")])
    return tmp_path, opened, loaded


def still_open(fds):
    out = []
    for fd in fds:
        try:
            os.fstat(fd)
            out.append(fd)
        except OSError:
            pass
    return out


def test_a_load_substitutes_this_process_map_fds(fake_kernel):
    cache, opened, loaded = fake_kernel
    fds = progcache.load(cache, "k1", cache, MapSizes(), ["kp_connect4"])
    maps = opened[:2]
    assert [INSN.unpack_from(loaded[0][1], i * 8)[3] for i in (1, 4)] == maps
    assert still_open(opened) == [fds["kp_connect4"]]      # the map fds are closed again
    os.close(fds["kp_connect4"])


def test_a_verifier_rejection_is_a_miss_with_its_log_and_leaves_no_fd(fake_kernel):
    cache, opened, _ = fake_kernel
    with pytest.raises(CacheMiss, match="rejected cached kp_connect6.*invalid mem access"):
        progcache.load(cache, "k1", cache, MapSizes(), ["kp_connect4", "kp_connect6"])
    assert len(opened) == 3 and still_open(opened) == []


def test_a_pinned_map_of_another_shape_is_a_miss(monkeypatch, tmp_path):
    class Info:
        type, key_size, value_size, map_flags = 1, 4, 4, 0

    monkeypatch.setattr(progcache.os.path, "exists", lambda p: True)
    monkeypatch.setattr(progcache.libbpf, "obj_get", lambda p: os.open(os.devnull, os.O_RDONLY))
    monkeypatch.setattr(progcache.libbpf, "map_info", lambda fd: Info)
    with pytest.raises(CacheMiss, match=r"pinned map .*_v\d+ has .*, expected"):
        progcache.open_maps(tmp_path, MapSizes())


def test_maps_are_shaped_as_bcc_creates_them():
    from kproxy_ebpf.datapath.maps.layout import MAPS

    shape = progcache.map_shape(MAPS["servicecidr"], MapSizes(servicecidr=77))
    assert shape == {"type": 11, "key_size": 20, "value_size": 4, "max_entries": 77, "flags": 1,
                     "name": "kp_svccidr"}
    assert progcache.map_shape(MAPS["stats"], MapSizes())["value_size"] == 8   # per CPU value
    assert progcache.map_shape(MAPS["tccfg"], MapSizes())["max_entries"] == 1


def test_prune_keeps_the_most_recently_used_and_remove_only_ours(tmp_path):
    for i in range(6):
        (tmp_path / f"k{i}.json").write_text("{}")
        os.utime(tmp_path / f"k{i}.json", (i, i))
    progcache.touch(tmp_path, "k0")
    assert sorted(progcache.prune(tmp_path, keep=3)) == ["k1.json", "k2.json", "k3.json"]
    (tmp_path / "notes.txt").write_text("an operator's")
    assert len(progcache.remove(tmp_path)) == 3 and (tmp_path / "notes.txt").exists()


# -- the load child's decisions -------------------------------------------------------------------
@pytest.fixture
def child(monkeypatch, tmp_path):
    compiled = []
    monkeypatch.setattr(compile_child, "_compile", lambda progs, bpffs, sizes, stage:
                        compiled.append(stage) or [record()])
    monkeypatch.setattr(compile_child, "cache_inputs", lambda progs, sizes: {"i": 1})
    request = {"bpffs_dir": str(tmp_path), "stage": str(tmp_path / "stage"),
               "sizes": {}, "programs": [{"name": "kp_connect4"}],
               "cache_dir": str(tmp_path / "cache")}
    return request, compiled


def test_the_child_compiles_and_stores_on_a_first_start(child):
    request, compiled = child
    status = compile_child._child(request)
    assert compiled and status["cache"] == "miss" and status["stored"].endswith(".json")


def test_the_child_falls_back_to_the_compile_on_a_bad_entry(child, monkeypatch):
    request, compiled = child

    def bad(*a):
        raise CacheMiss("the kernel rejected cached kp_connect4: Permission denied")

    monkeypatch.setattr(progcache, "load", bad)
    status = compile_child._child(request)
    assert compiled and status["cache"] == "fallback"
    assert "rejected" in status["reason"] and "stored" in status


def test_what_cannot_be_recorded_still_loads_and_says_why(child, monkeypatch):
    request, compiled = child
    monkeypatch.setattr(compile_child, "_compile", lambda *a: compiled.append(1) or "kp_x: fd 9")
    status = compile_child._child(request)
    assert compiled and status["store_error"] == "kp_x: fd 9"


def test_without_a_cache_directory_the_child_only_compiles(child):
    request, compiled = child
    request["cache_dir"] = None
    assert compile_child._child(request) == {"cache": "off"} and compiled


def test_the_parent_reads_the_status_line_and_logs_a_fallback(caplog):
    assert progload._status("clang noise\n{\"cache\": \"hit\", \"key\": \"abc\"}\n") == \
        {"cache": "hit", "key": "abc"}
    assert progload._status("") == {}
    job = progload.LoadJob.__new__(progload.LoadJob)
    job.programs = [1, 2]
    job._report({"cache": "fallback", "reason": "entry x is corrupt"}, 2.0)
    assert job.cache_result == "fallback"
    assert "program cache not used, compiling instead: entry x is corrupt" in caplog.text


def test_cleanup_empties_the_program_cache_unless_told_to_keep_it(tmp_path):
    from click.testing import CliRunner

    from kproxy_ebpf.cli.main import main

    cache = tmp_path / "programs"
    cache.mkdir()
    (cache / "k1.json").write_text("{}")
    args = ["cleanup", "--yes", "--bpffs-dir", str(tmp_path / "none")]
    out = CliRunner().invoke(main, [*args, "--program-cache", ""])
    assert out.exit_code == 0 and (cache / "k1.json").exists()
    out = CliRunner().invoke(main, [*args, "--program-cache", str(cache)])
    assert out.exit_code == 0, out.output
    assert f"removed {cache / 'k1.json'}" in out.output and not cache.exists()
