"""Reflectors and one-shot LISTs bound to the official client's list methods."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .event import EventHandler
from .loop import ListFunc, Reflector
from .pager import list_pages

RESOURCES = ("services", "endpointslices", "node")


def reflector_for(
    api_client: Any,
    resource: str,
    on_event: EventHandler,
    *,
    node_name: str | None = None,
    label_selector: str | None = None,
    **options: Any,
) -> Reflector:
    """A Reflector for one of RESOURCES, bound to the official client's list methods.

    services: core/v1 Services in all namespaces; endpointslices: discovery.k8s.io/v1
    EndpointSlices in all namespaces; node: the single Node `node_name` (field selector
    metadata.name). label_selector narrows services/endpointslices server-side (kube-proxy
    uses "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"; an
    object that stops matching arrives as DELETED). Other options go to Reflector.
    """
    bound = list_function(api_client, resource, node_name=node_name, label_selector=label_selector)
    return Reflector(resource, bound, bound, on_event, **options)


def list_function(api_client: Any, resource: str, *, node_name: str | None = None,
                  label_selector: str | None = None) -> ListFunc:
    """The client's list method for one of RESOURCES, bound to its selectors (see
    reflector_for); serves LIST and, with watch=True, WATCH."""
    import functools

    from kubernetes import client

    selectors: dict[str, str] = {}
    if label_selector:
        selectors["label_selector"] = label_selector
    if resource == "services":
        fn = client.CoreV1Api(api_client).list_service_for_all_namespaces
    elif resource == "endpointslices":
        fn = client.DiscoveryV1Api(api_client).list_endpoint_slice_for_all_namespaces
    elif resource == "servicecidrs":
        fn = client.NetworkingV1Api(api_client).list_service_cidr
    elif resource == "node":
        if not node_name:
            raise ValueError("the node reflector needs node_name")
        fn = client.CoreV1Api(api_client).list_node
        selectors["field_selector"] = f"metadata.name={node_name}"
    else:
        raise ValueError(f"unknown resource {resource!r}; expected one of {', '.join(RESOURCES)}")
    return functools.partial(fn, **selectors) if selectors else fn


def list_once(api_client: Any, resource: str, *, node_name: str | None = None,
              label_selector: str | None = None, transform: Callable[[dict], Any] | None = None,
              page_size: int = 500, timeout: tuple[float, float] = (10.0, 60.0)) -> list:
    """One complete, paginated LIST of a resource (the reflector's LIST without the watch):
    for one-shot readers such as `kproxy-ebpf check`."""
    fn = list_function(api_client, resource, node_name=node_name, label_selector=label_selector)

    def fetch(**kwargs: Any) -> bytes:
        resp = fn(_preload_content=False, _request_timeout=timeout, **kwargs)
        try:
            return resp.data
        finally:
            resp.release_conn()

    listed = list_pages(fetch, page_size=page_size, transform=transform)
    assert listed is not None       # never stopped
    return listed[0]
