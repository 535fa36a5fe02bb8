"""The C source handed to bcc: a program with the project's own headers inlined.

bcc rewrites map operations (`kp_svc.lookup(&key)`) only in the main file it compiles, not
in included headers. The shared lookup code lives in bpf/lib/*.h so that every program (socket
hooks, TC, the test-run harness) uses the same functions, so each program's own quoted includes
are expanded into one text before bcc sees it; `#line` markers keep compiler messages pointing
at the original files. System includes (<...>) are left to the compiler.
"""
from __future__ import annotations

import re
from pathlib import Path

from .paths import bpf_dir

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def expand(path: Path, root: Path | None = None, _stack: tuple[Path, ...] = ()) -> str:
    """The text of `path` with every `#include "x"` under `root` (bpf/) inlined."""
    root = root or bpf_dir()
    path = path.resolve()
    if path in _stack:
        raise ValueError(f"include cycle: {' -> '.join(str(p) for p in (*_stack, path))}")
    out = [f'#line 1 "{path}"']
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        m = _INCLUDE.match(line)
        target = (path.parent / m.group(1)).resolve() if m else None
        if target is None or not target.is_file() or root.resolve() not in target.parents:
            out.append(line)
            continue
        out.append(expand(target, root, (*_stack, path)))
        out.append(f'#line {lineno + 1} "{path}"')
    return "\n".join(out) + "\n"
