"""Loading Services and EndpointSlices from YAML files and directories.

Conventions: Service ClusterIPs 172.30.0.0/16, pod IPs 10.0.0.0/8 (data only).
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kproxy_ebpf.kube.manifests import load_manifests, manifest_files
from kproxy_ebpf.model.objects import Endpoint, EndpointPort, Protocol, ServicePort

MULTI_DOC = """\
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ns1}
spec:
  clusterIP: 172.30.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
# a Deployment in the same file is skipped
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: ns1}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: ns1
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.0.1.5]
  conditions: {ready: true}
  nodeName: node-a
---
"""


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_multi_document_file(tmp_path):
    services, slices, rejections = load_manifests([write(tmp_path / "all.yaml", MULTI_DOC)])
    assert rejections == []
    assert [(s.namespace, s.name, s.cluster_ips, s.ports) for s in services] == [
        ("ns1", "web", ("172.30.0.10",), (ServicePort("http", Protocol.TCP, 80),))]
    assert len(slices) == 1
    assert slices[0].service_name == "web"
    assert slices[0].ports == (EndpointPort("http", Protocol.TCP, 8080),)
    assert slices[0].endpoints == (Endpoint.of("10.0.1.5", ready=True, node_name="node-a"),)


def test_directory_reads_yaml_and_yml_in_name_order(tmp_path):
    write(tmp_path / "b.yml", "kind: Service\nmetadata: {name: b}\nspec: {clusterIP: 172.30.0.2}\n")
    write(tmp_path / "a.yaml", "kind: Service\nmetadata: {name: a}\nspec: {clusterIP: 172.30.0.1}\n")
    write(tmp_path / "notes.txt", "kind: Service\nmetadata: {name: ignored}\nspec: {}\n")
    (tmp_path / "sub.yaml").mkdir()   # a directory with a YAML-ish name is not a file
    assert [p.name for p in manifest_files([tmp_path])] == ["a.yaml", "b.yml"]
    services, slices, rejections = load_manifests([tmp_path])
    assert [s.name for s in services] == ["a", "b"]
    assert all(s.namespace == "default" for s in services)
    assert slices == [] and rejections == []


def test_list_kinds(tmp_path):
    # kubectl's `kind: List` (items carry their kind) and the API's typed lists (items do not).
    write(tmp_path / "lists.yaml", """\
        apiVersion: v1
        kind: List
        items:
        - {apiVersion: v1, kind: Service, metadata: {name: s1, namespace: x}, spec: {clusterIP: 172.30.0.1}}
        - {apiVersion: v1, kind: ConfigMap, metadata: {name: cm}}
        ---
        apiVersion: v1
        kind: ServiceList
        items:
        - {metadata: {name: s2, namespace: x}, spec: {clusterIP: 172.30.0.2}}
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSliceList
        items:
        - {metadata: {name: e1, namespace: x}, addressType: IPv4, endpoints: []}
        - {metadata: {name: e2, namespace: x}, addressType: IPv6}
        """)
    services, slices, rejections = load_manifests([tmp_path / "lists.yaml"])
    assert [s.name for s in services] == ["s1", "s2"]
    assert [(e.name, e.address_type) for e in slices] == [("e1", "IPv4"), ("e2", "IPv6")]
    assert rejections == []


def test_bad_objects_are_rejected_and_the_rest_loads(tmp_path):
    write(tmp_path / "mixed.yaml", """\
        kind: Service
        metadata: {namespace: x}
        spec: {clusterIP: 172.30.0.1}
        ---
        kind: Service
        metadata: {name: ok, namespace: x}
        spec:
          clusterIP: 172.30.0.3
          ports: [{name: a, port: 0}, {name: b, port: 81}]
        ---
        apiVersion: discovery.k8s.io/v1beta1
        kind: EndpointSlice
        metadata: {name: old, namespace: x}
        addressType: IPv4
        ---
        - just
        - a list
        """)
    services, slices, rejections = load_manifests([tmp_path / "mixed.yaml"])
    assert [(s.name, s.ports) for s in services] == [("ok", (ServicePort("b", Protocol.TCP, 81),))]
    assert slices == []
    assert [r.reason for r in rejections] == ["InvalidMetadata", "InvalidPort", "UnsupportedAPIVersion",
                                              "InvalidManifest"]


def test_yaml_syntax_error_is_a_rejection_not_an_exception(tmp_path):
    bad = write(tmp_path / "bad.yaml", "kind: Service\nmetadata: {name: [unclosed\n")
    good = write(tmp_path / "good.yaml", "kind: Service\nmetadata: {name: g}\nspec: {clusterIP: 172.30.0.9}\n")
    services, _, rejections = load_manifests([bad, good])
    assert [s.name for s in services] == ["g"]
    assert len(rejections) == 1
    assert (rejections[0].kind, rejections[0].name, rejections[0].reason) == ("File", str(bad), "InvalidManifest")


def test_missing_path_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        load_manifests([tmp_path / "does-not-exist.yaml"])


def test_empty_file(tmp_path):
    assert load_manifests([write(tmp_path / "empty.yaml", "")]) == ([], [], [])
