"""The package's import graph, read from the sources with ast (nothing is imported).

The layers are the packages below kproxy_ebpf/, lowest first; a module may import its own
package's layer and those below it, never one above (test_the_docstring_is_the_table checks
this table against LAYERS):

    0  kproxy_ebpf, model          the version; the lean API types and the desired datapath
    1  kube, proxy, datapath       siblings that never import each other: kube turns API objects
                                   into model, proxy turns model into desired, datapath writes
                                   desired into the kernel
    2  config                      the node's configuration (flags, file, defaults)
    3  serve                       health, metrics and the HTTP servers
    4  inspect                     check, trace, watch: the cluster against the maps
    5  agent                       the sync loop and its policy, `kproxy-ebpf run`
    6  dev.lab                     the simulated cluster, which runs the agent
    7  dev.bench                   benchmarks on the lab
    8  cli                         the command, which mounts lab and bench

Every import counts: at module level, inside a function (lazy) and under TYPE_CHECKING, since
each is an arrow a reader has to follow. And no cycle, not even within a layer.
"""
from __future__ import annotations

import ast
from pathlib import Path

import kproxy_ebpf

ROOT = Path(kproxy_ebpf.__file__).resolve().parent
LAYERS: tuple[tuple[str, ...], ...] = (
    ("kproxy_ebpf", "model"),
    ("kube", "proxy", "datapath"),
    ("config",),
    ("serve",),
    ("inspect",),
    ("agent",),
    ("dev.lab",),
    ("dev.bench",),
    ("cli",),
)
SIBLINGS = ("kube", "proxy", "datapath")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("kproxy_ebpf", *path.relative_to(root).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `name` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from . import x` imports the module x when there is one, else a name of base.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:     # kproxy_ebpf.x.y.attr -> kproxy_ebpf.x.y
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = modules(root)
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def unit(module: str) -> str:
    """The layer table's name for a module: its package (or module) right below kproxy_ebpf,
    and below dev/ for the harness."""
    parts = module.split(".")
    if parts[1:] == ["dev"]:
        return "kproxy_ebpf"  # dev/__init__.py only names the harness's folder
    if len(parts) > 2 and parts[1] == "dev":
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else parts[0]


def layer(module: str) -> int:
    for i, names in enumerate(LAYERS):
        if unit(module) in names:
            return i
    raise KeyError(f"{module}: in no layer of this test's table (add it where it belongs)")


def upward(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(edges.items()):
        for dst in sorted(targets):
            if layer(dst) > layer(src):
                bad.append(f"{src} -> {dst} (layer {layer(src)} imports layer {layer(dst)})")
            elif unit(src) != unit(dst) and {unit(src), unit(dst)} <= set(SIBLINGS):
                bad.append(f"{src} -> {dst} ({' and '.join(SIBLINGS)} never import each other)")
    return bad


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_docstring_is_the_table():
    rows = [line.split(None, 1) for line in __doc__.splitlines() if line[:5].strip().isdigit()]
    table = [tuple(n.strip() for n in rest.split("  ")[0].split(",")) for _, rest in rows]
    assert [int(n) for n, _ in rows] == list(range(len(LAYERS)))
    assert tuple(table) == LAYERS


def test_every_package_is_a_layer():
    """The tree is the diagram: each folder (and module) right below kproxy_ebpf/ is a row."""
    below = {p.stem for p in ROOT.iterdir() if (p.suffix == ".py" or (p / "__init__.py").exists())}
    below = {f"dev.{p.name}" for p in (ROOT / "dev").iterdir() if (p / "__init__.py").exists()} | (
        below - {"__init__", "dev"})
    assert below | {"kproxy_ebpf"} == {n for names in LAYERS for n in names}


def test_every_module_is_in_a_layer():
    assert [m for m in graph() if not any(unit(m) in names for names in LAYERS)] == []


def test_no_module_imports_a_layer_above_its_own():
    assert upward(graph()) == []


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_the_walk_sees_every_kind_of_import(tmp_path):
    """The checks above cannot pass by seeing nothing: a lazy import, one under TYPE_CHECKING
    and a relative one each make the arrow they should."""
    pkg = tmp_path / "kproxy_ebpf"
    for d in ("proxy", "model", "cli"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "model" / "objects.py").write_text("")
    (pkg / "proxy" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..cli import main\n")
    (pkg / "proxy" / "b.py").write_text("def f():\n    from . import a\n")
    (pkg / "cli" / "main.py").write_text("from ..proxy import b\nimport kproxy_ebpf.model.objects\n")
    edges = graph(pkg)
    assert edges["kproxy_ebpf.proxy.a"] == {"kproxy_ebpf.cli.main"}
    assert edges["kproxy_ebpf.proxy.b"] == {"kproxy_ebpf.proxy.a"}
    assert edges["kproxy_ebpf.cli.main"] == {"kproxy_ebpf.proxy.b", "kproxy_ebpf.model.objects"}
    assert upward(edges) == ["kproxy_ebpf.proxy.a -> kproxy_ebpf.cli.main (layer 1 imports layer 8)"]
    assert cycles(edges) == [["kproxy_ebpf.cli.main", "kproxy_ebpf.proxy.a", "kproxy_ebpf.proxy.b"]]
    assert upward({"kproxy_ebpf.proxy.x": {"kproxy_ebpf.kube.y"}}) != []
