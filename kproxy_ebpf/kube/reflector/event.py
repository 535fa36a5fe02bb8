"""What a reflector delivers: one Event type for the synthetic SYNC and the watch's events."""
from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

T = TypeVar("T")


class EventType(enum.StrEnum):
    """A StrEnum, so that logs and metrics print the API's own words ("ADDED", "SYNC")."""
    SYNC = "SYNC"           # ours: the complete set after a LIST, which replaces what was known
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


# The watch stream's types that carry an object for the consumer, by their text on the wire
# (BOOKMARK and ERROR are the reflector's own business).
WATCH_TYPES = {t.value: t for t in (EventType.ADDED, EventType.MODIFIED, EventType.DELETED)}


class Event(NamedTuple, Generic[T]):
    """`objects`: every listed object for SYNC, the one object for a watch event; each as the
    reflector's decode made it (the JSON object without one)."""
    type: EventType
    objects: list[T]


EventHandler = Callable[[Event], None]
# decode(type of the event the object came in, its JSON object): what the Event carries.
Decode = Callable[[EventType, dict], Any]
