"""Compiles every BPF program under bpf/ as bcc's front end does, with -Wall -Werror: the C half
of `make lint` (.venv/bin/python tools/bpflint.py). Needs clang, libbcc and the kernel header
tree (tools/setup-headers.sh); not root: nothing is loaded and no map is made.

bcc cannot stop after the compile (it creates the programs' maps next), so this runs clang
itself on the text bcc is given (source.expand(): the program with bpf/'s headers inlined,
#line markers pointing at the real files), with bcc's first-pass flags: the host target, the
kernel tree's include paths and defines, and bcc's own bpf.h, bpf_workaround.h and helpers.h
(the BPF_TABLE macros and helper prototypes) forced in ahead of it. Those three live only
inside libbcc, so they are read out of it. bcc appends its own -Wno- flags to every compile;
they are left out here, so the warnings bcc would hide are seen. Every header under bpf/ must
be reached by some program, so none escapes the check.
"""
from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from kproxy_ebpf.datapath.load.compile_child import program_cflags
from kproxy_ebpf.datapath.load.paths import bpf_dir, kernel_headers
from kproxy_ebpf.datapath.load.source import expand

# Each header bcc forces into a compile (-include /virtual/include/bcc/NAME), found in libbcc
# by a line only it has.
BCC_HEADERS = {
    "bpf.h": b"#define _UAPI__LINUX_BPF_H__",
    "bpf_workaround.h": b"#define __HAVE_BUILTIN_BSWAP16__",
    "helpers.h": b"#define __BPF_HELPERS_H",
}

# bcc 0.26's first pass as its DEBUG_PREPROCESSOR flag prints it, in its order: the kernel
# tree's (paths relative to it, the working directory) around bcc's forced headers.
KCONFIG = ["-include", "./include/linux/kconfig.h"]
KERNEL_FLAGS = [
    "-D__BPF_TRACING__",
    "-Iarch/x86/include/", "-Iarch/x86/include/generated", "-Iinclude",
    "-Iarch/x86/include/uapi", "-Iarch/x86/include/generated/uapi", "-Iinclude/uapi",
    "-Iinclude/generated/uapi",
    "-D__KERNEL__", '-DKBUILD_MODNAME="bcc"',
]

WARNINGS = [
    "-Wall", "-Werror",
    # Kernel-header noise, not ours: arch/x86/include/asm/processor.h takes the address of a
    # packed member (x86_hw_tss.sp0); bcc passes the same flag.
    "-Wno-address-of-packed-member",
]

LINE_MARKER = re.compile(r'^#line 1 "(.+)"$', re.MULTILINE)


def libbcc() -> Path:
    """The libbcc this process's dynamic loader picks, the one bcc itself loads."""
    ctypes.CDLL("libbcc.so.0")
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "/libbcc.so" in path:
            return Path(path)
    raise SystemExit("libbcc.so.0 loaded but not mapped")


def bcc_header(lib: bytes, marker: bytes) -> bytes:
    """The header text holding `marker`: one NUL-terminated string in libbcc's read-only data.
    It may follow other data rather than a NUL; bcc's headers are raw string literals that
    open with a newline, so the text starts at the first one."""
    if lib.count(marker) != 1:
        raise SystemExit(f"libbcc: {marker.decode()!r} found {lib.count(marker)} times, not once")
    at = lib.index(marker)
    text = lib[lib.rfind(b"\0", 0, at) + 1:lib.index(b"\0", at)]
    text = text[text.index(b"\n"):]
    if re.search(rb"[^\t\n\r\x20-\x7e]", text):
        raise SystemExit(f"libbcc: the text around {marker.decode()!r} is not one header")
    return text


def extract_bcc_headers(dest: Path) -> Path:
    """Writes bcc's forced headers to dest/bcc/; returns dest (for -isystem, as bcc's
    /virtual/include)."""
    lib = libbcc().read_bytes()
    (dest / "bcc").mkdir(parents=True)
    for name, marker in BCC_HEADERS.items():
        (dest / "bcc" / name).write_bytes(bcc_header(lib, marker))
    return dest


def clang_command(include: Path) -> list[str]:
    resource = subprocess.run(["clang", "-print-resource-dir"], check=True, capture_output=True,
                              text=True).stdout.strip()
    forced = [arg for name in BCC_HEADERS for arg in ("-include", str(include / "bcc" / name))]
    return ["clang", "--target=x86_64-unknown-linux-gnu", "-fsyntax-only", "-O2",
            "-nostdinc", "-isystem", f"{resource}/include", *KCONFIG, *forced,
            "-isystem", str(include), *KERNEL_FLAGS,
            *program_cflags(Path("/sys/fs/bpf/kproxy-lint")), *WARNINGS, "-x", "c", "-"]


def main() -> int:
    root = bpf_dir()
    programs = sorted(root.rglob("*.c"))
    reached: set[Path] = set()
    failed = []
    with tempfile.TemporaryDirectory(prefix="kproxy-bpflint-") as tmp:
        cmd = clang_command(extract_bcc_headers(Path(tmp)))
        for program in programs:
            text = expand(program)
            reached.update(Path(p) for p in LINE_MARKER.findall(text))
            run = subprocess.run(cmd, input=text, cwd=kernel_headers(), capture_output=True,
                                 text=True)
            sys.stderr.write(run.stderr)
            if run.returncode:
                failed.append(program.relative_to(root))
    unreached = sorted(h.relative_to(root) for h in root.rglob("*.h") if h.resolve() not in reached)
    for header in unreached:
        print(f"bpflint: bpf/{header} is included by no program, so nothing compiles it",
              file=sys.stderr)
    for program in failed:
        print(f"bpflint: bpf/{program} does not compile cleanly", file=sys.stderr)
    if failed or unreached:
        return 1
    print(f"bpflint: {len(programs)} programs clean with {' '.join(WARNINGS[:2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
