"""The lean import of the kubernetes client (kube/lean.py): the agent's calls work, the model
classes it never uses are not imported. Run in a fresh interpreter: this one may have imported
the whole client already."""
import json
import os
import subprocess
import sys

PROBE = r"""
import json, sys
from kproxy_ebpf.kube.client import make_api_client
from kproxy_ebpf.kube.events import EventRecorder
from kproxy_ebpf.kube.reflector import list_function
from kproxy_ebpf.kube.sources import service_cidr_reflector

api = make_api_client(master="127.0.0.1:1")
fns = [list_function(api, r) for r in ("services", "endpointslices")]
fns.append(list_function(api, "node", node_name="n1"))
service_cidr_reflector(api, lambda *a: None)
EventRecorder(api, host="n1").stop()
from kubernetes import client
from kubernetes.client.models import CoreV1Event
from kubernetes.client.rest import ApiException
print(json.dumps({
    "lazy": type(sys.modules["kubernetes.client.models"]).__name__,
    "models": sum(m.startswith("kubernetes.client.models.") for m in sys.modules),
    "apis": sum(m.startswith("kubernetes.client.api.") for m in sys.modules),
    "host": api.configuration.host,
    "event_module": CoreV1Event.__module__,
    "same_api_client": client.ApiClient is type(api),
    "exception": issubclass(ApiException, Exception),
    "version": sys.modules["kubernetes"].__version__,
}))
"""


def test_the_agents_client_calls_import_only_what_they_use(tmp_path):
    # The user's own ~/.kube/config (kind writes one) must not decide what this probe loads.
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | {"HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, env=env).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["lazy"] == "LazyPackage"
    assert got["models"] <= 5, "a few model modules at most, not ~800"
    assert got["apis"] <= 5
    assert got["host"] == "https://127.0.0.1:1"
    assert got["event_module"] == "kubernetes.client.models.core_v1_event"
    assert got["same_api_client"] and got["exception"]
    assert got["version"][0].isdigit()


def test_install_is_a_no_op_once_the_client_is_imported():
    probe = ("import kubernetes, sys\nfrom kproxy_ebpf.kube import lean\n"
             "print(lean.install(), len(sys.modules['kubernetes.client.models'].__dict__) > 500)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "True"]
