"""The frontend table from the Services' own frontends, and the problems of each Service.

Two Services may claim the same ip:port/protocol (the same externalIP, an LB IP equal to a node
address, ...). The table must still be deterministic and the same on every node and after every
restart, so the claim of the first Service in (namespace, name) order wins and the others get a
FrontendConflict problem. When the winner goes away the next claimant takes over.

Everything is kept per Service and per key, so an update costs O(what changed): the merged
table is handed out as a read-only view, never copied.
"""
from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, KeysView, Mapping
from types import MappingProxyType

from kproxy_ebpf.model.desired import Frontend, FrontendKey, Problem, Scope
from kproxy_ebpf.model.objects import ServiceKey


class Claims:
    """Each Service's own frontends (before conflict resolution) and problems, the claimants
    of each key, the merged table and the current problems with their number by reason."""

    def __init__(self) -> None:
        self._raw: dict[ServiceKey, dict[FrontendKey, Frontend]] = {}
        self._own_problems: dict[ServiceKey, list[Problem]] = {}
        # Claimants of each frontend key, sorted: owners[k][0] wins.
        self._owners: dict[FrontendKey, list[ServiceKey]] = {}
        self._merged: dict[FrontendKey, Frontend] = {}
        self.view: Mapping[FrontendKey, Frontend] = MappingProxyType(self._merged)
        # Current problems (own and conflicts) of each Service that has any, kept up to date
        # by report() for the Services it is given, and their number by reason.
        self._problems: dict[ServiceKey, list[Problem]] = {}
        self._problem_counts: Counter[str] = Counter()

    def claimants(self) -> KeysView[ServiceKey]:
        """The Services that claim any frontend (a live view)."""
        return self._raw.keys()

    def with_problems(self) -> KeysView[ServiceKey]:
        """The Services with problems of their own (a live view)."""
        return self._own_problems.keys()

    def own(self, key: ServiceKey) -> Mapping[FrontendKey, Frontend]:
        return self._raw.get(key, {})

    def set_own(self, key: ServiceKey, fronts: dict[FrontendKey, Frontend],
                probs: list[Problem]) -> set[FrontendKey]:
        """A Service's own frontends and problems, newly computed; returns the keys whose
        frontend from this Service changed (empty when none did)."""
        if probs:
            self._own_problems[key] = probs
        else:
            self._own_problems.pop(key, None)
        old = self._raw.get(key, {})
        if fronts == old:
            return set()
        for fkey in old.keys() - fronts.keys():
            owners = self._owners[fkey]
            owners.remove(key)
            if not owners:
                del self._owners[fkey]
        for fkey in fronts.keys() - old.keys():
            bisect.insort(self._owners.setdefault(fkey, []), key)
        if fronts:
            self._raw[key] = fronts
        else:
            self._raw.pop(key, None)
        return {k for k in old.keys() | fronts.keys() if old.get(k) != fronts.get(k)}

    def merge(self, affected: Iterable[FrontendKey]
              ) -> tuple[set[FrontendKey], set[ServiceKey], set[ServiceKey]]:
        """Settles the winner of each affected key. Returns the keys whose effective frontend
        changed, the Services those frontends belong (or belonged) to, and the claimants of
        the keys still held, whose conflicts a winner change may have altered."""
        changed_keys: set[FrontendKey] = set()
        changed_services: set[ServiceKey] = set()
        claimants: set[ServiceKey] = set()
        for fkey in affected:
            owners = self._owners.get(fkey)
            prev = self._merged.get(fkey)
            cur = self._raw[owners[0]][fkey] if owners else None
            if cur is None or owners is None:
                self._merged.pop(fkey, None)
            else:
                self._merged[fkey] = cur
                claimants.update(owners)
            if prev != cur:
                changed_keys.add(fkey)
                for fe in (prev, cur):
                    if fe is not None:
                        changed_services.add((fe.service.namespace, fe.service.name))
        return changed_keys, changed_services, claimants

    def report(self, keys: Iterable[ServiceKey]) -> list[Problem]:
        """Re-evaluates the problems of these Services; returns them, in Service order."""
        problems: list[Problem] = []
        for k in sorted(keys):
            probs = self._problems_of(k)
            self._set_problems(k, probs)
            problems += probs
        return problems

    def _problems_of(self, key: ServiceKey) -> list[Problem]:
        out = list(self._own_problems.get(key, ()))
        for fkey, fe in sorted(self._raw.get(key, {}).items()):
            winner = self._owners[fkey][0]
            if winner != key and fkey.scope is Scope.SOCK:   # EXT keys mirror a socket key
                out.append(Problem(key[0], key[1], "Service", "FrontendConflict",
                                   f"{fe.kind.value} {fkey} is also claimed "
                                   f"by {winner[0]}/{winner[1]}, which keeps it (first in "
                                   "namespace/name order)"))
        return out

    def _set_problems(self, key: ServiceKey, probs: list[Problem]) -> None:
        for p in self._problems.pop(key, ()):
            self._problem_counts[p.reason] -= 1
            if not self._problem_counts[p.reason]:
                del self._problem_counts[p.reason]
        if probs:
            self._problems[key] = probs
            self._problem_counts.update(p.reason for p in probs)

    def frontends_by_service(self) -> dict[ServiceKey, list[Frontend]]:
        """The effective (post-conflict) frontends, per Service."""
        out: dict[ServiceKey, list[Frontend]] = {}
        for key in sorted(self._merged):
            fe = self._merged[key]
            out.setdefault((fe.service.namespace, fe.service.name), []).append(fe)
        return out

    def problems(self) -> list[Problem]:
        """Every current problem, in Service order. O(problems)."""
        return [p for k in sorted(self._problems) for p in self._problems[k]]

    def problem_counts(self) -> Mapping[str, int]:
        """Current problems by reason (a live read-only view). O(1)."""
        return MappingProxyType(self._problem_counts)
