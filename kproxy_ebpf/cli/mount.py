"""The root group's command lookup: `lab` and `bench` mounted only when asked for and
installed, and a suggestion for a mistyped command."""
from __future__ import annotations

import click


class LazyGroup(click.Group):
    """`lab` and `bench` are imported only when asked for: they pull in the Kubernetes client
    models and pyroute2 (~0.35 s), which `run` (the agent's cold start) must not pay. The
    agent's image ships neither (Dockerfile): there they are not listed, and asking for one
    says so."""
    LAZY = {"lab": "kproxy_ebpf.dev.lab.cli", "bench": "kproxy_ebpf.dev.bench.cli"}

    @staticmethod
    def _installed(module: str) -> bool:
        import importlib.util

        try:
            return importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:         # its package (lab/, bench/) is not there
            return False

    def list_commands(self, ctx):
        lazy = [n for n, mod in self.LAZY.items() if self._installed(mod)]
        return sorted(set(super().list_commands(ctx)) | set(lazy))

    def resolve_command(self, ctx, args):
        """click's, with a suggestion for a mistyped command (`service` -> `services`)."""
        if (args and not args[0].startswith("-") and args[0] not in self.LAZY
                and args[0] not in self.list_commands(ctx)):
            from .names import suggestion

            ctx.fail(f'No such command "{args[0]}".'
                     + suggestion(args[0], self.list_commands(ctx)))
        return super().resolve_command(ctx, args)

    def get_command(self, ctx, name):
        if name in self.LAZY and name not in self.commands:
            import importlib

            if not self._installed(self.LAZY[name]):
                ctx.fail(f"`{name}` is not installed here: the agent's image holds the agent "
                         f"only; run `kproxy-ebpf {name}` from a source checkout")
            self.add_command(getattr(importlib.import_module(self.LAZY[name]), name))
        return super().get_command(ctx, name)
