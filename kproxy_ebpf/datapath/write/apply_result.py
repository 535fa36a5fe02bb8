"""What one apply did to the maps: counts for the sync's log line and metrics, and the
failures (a full map named, frontends to retry), recorded step by step so that one bad write
never stops the others."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kproxy_ebpf.datapath.maps.pinned import MapFull
from kproxy_ebpf.model.desired import FrontendKey, ServicePortName


@dataclass
class ApplyResult:
    updated: int = 0          # frontends written
    deleted: int = 0          # frontends removed
    writes: int = 0           # map rows written or deleted
    errors: list[str] = field(default_factory=list)
    full_maps: set[str] = field(default_factory=set)
    failed: dict[FrontendKey, ServicePortName | None] = field(default_factory=dict)  # retry these

    @property
    def ok(self) -> bool:
        return not self.errors

    def attempt(self, what: str, fn, failures: tuple[type[Exception], ...] = (OSError,)) -> bool:
        """Runs one write step; a failure is recorded against `what` (and a full map named),
        and the caller goes on with the next step."""
        try:
            fn()
        except MapFull as exc:
            self.full_maps.add(exc.map_name)
            self.errors.append(f"{what}: {exc}")
            return False
        except failures as exc:
            self.errors.append(f"{what}: {exc}")
            return False
        return True

    def outcome(self, cidrs_written: bool = True) -> Outcome:
        return Outcome(self.updated, self.deleted, self.writes, tuple(self.errors),
                       frozenset(self.full_maps), MappingProxyType(dict(self.failed)),
                       cidrs_written)


@dataclass(frozen=True)
class Outcome:
    """What one sync's apply did, frozen once the datapath is written: the sync reports it."""
    updated: int
    deleted: int
    writes: int
    errors: tuple[str, ...]
    full_maps: frozenset[str]
    failed: Mapping[FrontendKey, ServicePortName | None]    # retried by a later sync
    cidrs_written: bool        # every ServiceCIDR row written (else all are written next)

    @property
    def ok(self) -> bool:
        return not self.errors
