"""List+watch of one resource, fed to a callback: the agent's view of the API server.

Why our own reflector instead of `kubernetes.watch.Watch`: the proxy must see the raw stream.
`Watch` deserializes every object into the client's models (slow, and lossy for fields the
client does not know), swallows BOOKMARK events, and turns a 410 into an exception that looks
like any other. Here every request runs with `_preload_content=False` and we parse the JSON
lines ourselves, so the consumer gets plain dicts (see kube/convert/) and we can act on each
event type exactly.

The protocol, as client-go's reflector does it:

1. LIST, paginated (limit/continue), then `on_event(Event(SYNC, objects))`: the complete set as
   of the list's resourceVersion. The consumer *replaces* what it knew, so objects deleted
   while we were not watching disappear, and a relist never duplicates anything. With a
   `decode` (client-go's informer transform), each listed object is converted as its page
   arrives: a LIST of 10,000 EndpointSlices never holds all their JSON at once (that peak alone
   cost ~115 MiB of resident memory, which Python keeps afterwards).
2. WATCH from that resourceVersion with bookmarks and a server-side timeout (5 min plus
   jitter, so that many agents do not reconnect in step). ADDED/MODIFIED/DELETED go to
   `on_event(Event(type, [object]))`, the object through the same `decode`, on the same
   thread; BOOKMARK only advances the stored resourceVersion, which keeps the next resume cheap
   for the server.
3. When the watch ends (timeout, dropped connection, error), watch again from the last
   resourceVersion; errors wait for an exponential backoff with jitter first (retry.py).
4. When the server says that resourceVersion is gone (410 Gone / Expired, as an HTTP error or
   as an ERROR event in the stream), history is lost: go back to 1.

While the API server is away nothing is reported as deleted: the consumer keeps programming
what it last knew, and only a successful relist replaces the set. That is the behaviour a
proxy needs: an API server restart must not drop traffic.

The callback runs on the reflector's thread; it must be quick (queue work for the sync loop)
and thread-safe with respect to its readers. An exception in it is logged and counted, never
allowed to kill the watch.

    event.py    EventType and Event: what on_event receives
    loop.py     Reflector: the list/watch loop and its counters
    request.py  the in-flight request, which stop() cuts
    retry.py    backoff and relist bookkeeping
    pager.py    a paginated LIST, the next page fetched while this one is decoded
    wire.py     JSON bodies, watch lines, and the errors that mean "resume" or "relist"
    bind.py     reflectors and one-shot LISTs on the official client's list methods
"""
from .bind import RESOURCES, list_function, list_once, reflector_for
from .event import Decode, Event, EventHandler, EventType
from .loop import ListFunc, Reflector
from .pager import list_pages
from .wire import ResourceExpired, WatchError, WatchStalled

__all__ = [
    "RESOURCES", "Decode", "Event", "EventHandler", "EventType", "ListFunc", "Reflector",
    "ResourceExpired", "WatchError", "WatchStalled", "list_function", "list_once", "list_pages",
    "reflector_for",
]
