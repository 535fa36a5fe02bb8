"""Importing the official kubernetes client without importing all of it.

`import kubernetes` (or any of its submodules) runs `kubernetes/__init__.py`, which imports the
whole client: ~60 API classes and ~800 model classes, about 50 MiB resident for the agent's
life, although the agent uses three list calls, one Event call and no model class (it reads the
JSON itself, `_preload_content=False`). install() registers the four package modules that do
this (kubernetes, kubernetes.client, .client.api, .client.models) as lazy packages before
anything imports them: a name is imported from its own module when first used, found from the
package's own `from kubernetes.client.X import Name` lines, and submodules (`kubernetes.config`,
`kubernetes.client.rest`) import as usual. The client code itself runs unchanged.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from pathlib import Path

PACKAGES = ("kubernetes", "kubernetes.client", "kubernetes.client.api",
            "kubernetes.client.models")
_FROM = re.compile(r"^from (kubernetes(?:\.\w+)+) import (\w+)\s*$", re.M)
_VERSION = re.compile(r"^__version__ = ['\"]([^'\"]+)['\"]", re.M)


class LazyPackage(types.ModuleType):
    """A package whose names are imported on first access."""

    _names: dict[str, str]
    __version__: str        # the client's, read from its __init__ without importing it

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        source = self._names.get(name)
        try:
            value = (getattr(importlib.import_module(source), name) if source
                     else importlib.import_module(f"{self.__name__}.{name}"))
        except ModuleNotFoundError as exc:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}") from exc
        setattr(self, name, value)
        return value


def install() -> bool:
    """Makes later imports of the kubernetes client lean. A no-op (False) when the package is
    already imported, or not installed."""
    if "kubernetes" in sys.modules:
        return False
    spec = importlib.util.find_spec("kubernetes")
    if spec is None or spec.origin is None:
        return False
    root = Path(spec.origin).parent
    for name in PACKAGES:
        path = root.joinpath(*name.split(".")[1:])
        init = path / "__init__.py"
        text = init.read_text()
        mod = LazyPackage(name)
        mod.__file__, mod.__path__, mod.__package__ = str(init), [str(path)], name
        mod.__spec__ = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(path)])
        mod._names = {attr: source for source, attr in _FROM.findall(text)}
        version = _VERSION.search(text)
        if version:
            mod.__version__ = version.group(1)
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)
    return True
