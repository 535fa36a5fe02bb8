"""Golden dump: a fixed cluster (tests/golden/cluster.yaml) seen from node-a, through
conversion, policy and the writer, decoded by the CLI's reader, must give exactly
tests/golden/maps.json. A change in any layer shows up as a readable diff of map rows.
Regenerate deliberately with KPROXY_UPDATE_GOLDEN=1 after checking the diff.
"""
import json
import os
from pathlib import Path

from kproxy_ebpf.datapath.maps import reader
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.kube.manifests import load_manifests
from kproxy_ebpf.model.objects import Node
from kproxy_ebpf.proxy.state import ProxyState

from ...fakemaps import fake_maps

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def dump() -> dict:
    services, slices, rejections = load_manifests([GOLDEN / "cluster.yaml"])
    assert not rejections
    state = ProxyState(Node("node-a", addresses=("192.168.0.1",), zone="zone-a"))
    state.load(services, slices)
    maps = fake_maps()
    assert MapWriter(maps).apply(state.compute(full=True).frontends).ok
    rows = {name: reader.dump(m) for name, m in maps.items()}
    return {"services": reader.services(maps), "rows": rows}


def test_map_rows_match_the_golden_dump():
    got = json.dumps(dump(), indent=1, sort_keys=True) + "\n"
    path = GOLDEN / "maps.json"
    if os.environ.get("KPROXY_UPDATE_GOLDEN") == "1":
        path.write_text(got)
    assert got == path.read_text(), "map rows changed: review, then KPROXY_UPDATE_GOLDEN=1"
