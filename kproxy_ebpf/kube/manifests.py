"""Services and EndpointSlices read from YAML files instead of an API server.

`kproxy-ebpf run --manifests` uses this to program a node before (or without) a control plane,
and tests use it to describe a cluster in readable files. Documents go through the very same
convert functions as watched objects, so a manifest is rejected exactly when the same object
from the API would be.

Accepted input: files with one or more YAML documents (`---`), and directories, whose *.yaml and
*.yml files are read in name order (not recursively, so a directory is one flat, predictable
set). A document may be a Service, an EndpointSlice (discovery.k8s.io/v1), or a list of them
(`kind: List` as `kubectl get -o yaml` writes it, or ServiceList/EndpointSliceList as the API
returns it, whose items carry no kind). Other kinds are skipped: a file may also hold the
Deployments that go with its Services. A path that does not exist raises, since that is a
mistake on the command line; a file that does not parse becomes a Rejection, like any other bad
input.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from os import PathLike
from pathlib import Path
from typing import Any

import yaml

from kproxy_ebpf.model.objects import EndpointSlice, Service

from .convert import Rejection, service_from_api, slice_from_api

log = logging.getLogger("kproxy_ebpf.kube.manifests")

# libyaml's loader is several times faster; fall back to the pure-Python one when it is absent.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_SUFFIXES = (".yaml", ".yml")
_SLICE_API_VERSION = "discovery.k8s.io/v1"
# kind of the items of a typed list, which the API server sends without their own kind.
_LIST_ITEM_KIND = {"ServiceList": "Service", "EndpointSliceList": "EndpointSlice", "List": None}


def manifest_files(paths: Iterable[str | PathLike[str]]) -> list[Path]:
    """Expand files and directories into the list of files to read, in a stable order."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.suffix in _SUFFIXES and p.is_file()))
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"manifest path does not exist: {path}")
    return files


def load_manifests(
    paths: Iterable[str | PathLike[str]],
) -> tuple[list[Service], list[EndpointSlice], list[Rejection]]:
    """Read Services and EndpointSlices from YAML files and directories.

    Returns them in file order with every rejection met on the way. Raises FileNotFoundError
    for a path that does not exist; never raises on bad content.
    """
    services: list[Service] = []
    slices: list[EndpointSlice] = []
    rejections: list[Rejection] = []
    for path in manifest_files(paths):
        try:
            with path.open("rb") as f:
                docs = list(yaml.load_all(f, Loader=_Loader))
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
            rejections.append(Rejection("File", "", str(path), "InvalidManifest",
                                        f"cannot read YAML: {_one_line(exc)}"))
            continue
        for doc in docs:
            _load_doc(doc, None, path, services, slices, rejections)
    return services, slices, rejections


def _load_doc(doc: Any, implied_kind: str | None, path: Path, services: list[Service],
              slices: list[EndpointSlice], rejections: list[Rejection]) -> None:
    if doc is None:
        return      # an empty document, e.g. a trailing '---'
    if not isinstance(doc, dict):
        rejections.append(Rejection("File", "", str(path), "InvalidManifest",
                                    f"a document is a {type(doc).__name__}, not a mapping"))
        return
    kind = doc.get("kind", implied_kind)
    kind = kind if isinstance(kind, str) else None
    if kind in _LIST_ITEM_KIND:
        items = doc.get("items")
        if items is not None and not isinstance(items, list):
            rejections.append(Rejection("File", "", str(path), "InvalidManifest",
                                        f"{kind}.items is not a list"))
            return
        for item in items or ():
            _load_doc(item, _LIST_ITEM_KIND[kind], path, services, slices, rejections)
    elif kind == "Service":
        svc, rej = service_from_api(doc)
        rejections.extend(rej)
        if svc is not None:
            services.append(svc)
    elif kind == "EndpointSlice":
        api_version = doc.get("apiVersion", _SLICE_API_VERSION)
        if api_version != _SLICE_API_VERSION:
            meta: dict = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
            rejections.append(Rejection(
                "EndpointSlice", str(meta.get("namespace") or "default"), str(meta.get("name") or ""),
                "UnsupportedAPIVersion", f"{path}: apiVersion {api_version!r}, only {_SLICE_API_VERSION} "
                "is supported"))
            return
        eps, rej = slice_from_api(doc)
        rejections.extend(rej)
        if eps is not None:
            slices.append(eps)
    else:
        log.debug("%s: skipping a document of kind %r", path, kind)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
