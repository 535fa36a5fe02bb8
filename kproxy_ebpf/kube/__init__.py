"""The API side of the agent: what the cluster says, turned into model objects.

- convert/:   API objects (plain JSON dicts) -> kproxy_ebpf.model.objects types, plus Rejections
              for bad input; never raises. from_api(kind, raw) is the one entry point.
- manifests:  the same, from YAML files (`run --manifests`, tests).
- reflector/: list+watch of one resource with resourceVersion, bookmarks and 410 -> relist,
              delivering typed Events (EventType.SYNC, ADDED, MODIFIED, DELETED).
- sources:    the reflectors (or manifests) wired to the agent's Sink.
- events:     Warning Events for rejected objects, de-duplicated and rate limited.
- client:     building the kubernetes ApiClient (kubeconfig, in-cluster, --master).

Nothing here imports proxy/ or datapath/. The `kubernetes` package is imported lazily, inside
the functions that talk to an API server, so conversion and manifests stay cheap to import.
"""
from .client import ConfigError, make_api_client
from .convert import Converted, Rejection, from_api, node_from_api, service_from_api, slice_from_api
from .events import EventRecorder
from .manifests import load_manifests
from .reflector import Event, EventType, Reflector, ResourceExpired, reflector_for

__all__ = [
    "ConfigError",
    "Converted",
    "Event",
    "EventRecorder",
    "EventType",
    "Reflector",
    "Rejection",
    "ResourceExpired",
    "from_api",
    "load_manifests",
    "make_api_client",
    "node_from_api",
    "reflector_for",
    "service_from_api",
    "slice_from_api",
]
