"""ApiSource: listed objects are converted page by page, bad ones keep their last good version."""
from __future__ import annotations

import json
from typing import Any

from kproxy_ebpf.kube.sources import ApiSource


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def replace(self, kind: str, objs: list[Any], keep: set = frozenset()) -> None:
        self.calls.append(("replace", kind, [o.name for o in objs], set(keep)))

    def upsert(self, kind: str, obj: Any) -> None:
        self.calls.append(("upsert", kind, obj.name))

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self.calls.append(("delete", kind, namespace, name))

    def rejected(self, rejections: list) -> None:
        self.calls.append(("rejected", [(r.name, r.reason) for r in rejections]))


class Page:
    def __init__(self, items: list[dict], cont: str = "") -> None:
        meta = {"resourceVersion": "9", **({"continue": cont} if cont else {})}
        self.data = json.dumps({"metadata": meta, "items": items}).encode()

    def release_conn(self) -> None:
        pass


def service(name: str, **spec: Any) -> dict:
    return {"metadata": {"namespace": "ns", "name": name},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}], **spec}}


def test_list_is_converted_and_bad_objects_are_kept_not_deleted():
    sink = Sink()
    source = ApiSource(object(), "node-a", sink)       # no request is made: lists are faked
    refl = source.reflectors["services"]
    pages = iter([Page([service("a"), service("bad", type="Bogus")], cont="2"),
                  Page([service("c"), {"metadata": {"namespace": "ns"}}])])
    refl._list_fn = lambda **kw: next(pages)
    refl._list()
    assert sink.calls == [
        ("rejected", [("bad", "InvalidServiceType"), ("", "InvalidMetadata")]),
        ("replace", "Service", ["a", "c"], {("ns", "bad"), ("ns", "")}),
    ]
    assert refl.synced.is_set()
