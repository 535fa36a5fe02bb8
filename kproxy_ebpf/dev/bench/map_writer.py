"""The writer alone on real pinned maps: cold apply, restore (agent restart) and a no-op full
diff of N services x E endpoints, batched against one-by-one in the same run, and batched with
the cyclic GC paused during the cold apply as the agent's first sync runs (agent.pause_gc).

    sudo .venv/bin/python -m kproxy_ebpf.dev.bench.map_writer [--services 10000] [--endpoints 10]

A benchmark, not a test: it prints numbers. Maps are pinned under /sys/fs/bpf/kproxy-wbench
and removed after; nothing is attached and no packet is sent.
"""
from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

from kproxy_ebpf.agent.process_tuning import pause_gc
from kproxy_ebpf.datapath.load.bpffs import open_pinned_maps, remove_pins
from kproxy_ebpf.datapath.load.compile_child import compile_program
from kproxy_ebpf.datapath.load.paths import bpf_dir
from kproxy_ebpf.datapath.write import batch
from kproxy_ebpf.datapath.write import writer as W
from kproxy_ebpf.model.desired import Action, Backend, Frontend, FrontendKind, ServicePortName
from kproxy_ebpf.model.objects import Protocol

PINS = Path("/sys/fs/bpf/kproxy-wbench")


def table(services: int, endpoints: int) -> dict:
    out = {}
    for i in range(services):
        ip = f"10.{96 + i // 65536}.{(i // 256) % 256}.{i % 256}"
        bs = tuple(Backend.of(f"10.{128 + (i * endpoints + j) // 65536}."
                           f"{((i * endpoints + j) // 256) % 256}.{(i * endpoints + j) % 256}",
                           8080, Protocol.TCP) for j in range(endpoints))
        fe = Frontend(ip, 80, Protocol.TCP, FrontendKind.CLUSTER_IP,
                      ServicePortName("bench", f"s{i}", "", Protocol.TCP), Action.FORWARD, bs)
        out[fe.key] = fe
    return out


def run(desired: dict, batched: bool, gc_paused: bool = False) -> dict:
    remove_pins(PINS)
    bpf = compile_program(bpf_dir() / "sock_lb.c", PINS)
    maps = open_pinned_maps(PINS)
    saved = batch.BATCH_MIN
    batch.BATCH_MIN = batch.BATCH_MIN if batched else 10**12
    try:
        paused = gc_paused and pause_gc()       # as the agent's first sync runs
        t = time.perf_counter()
        res = W.MapWriter(maps).apply(desired)
        cold = time.perf_counter() - t
        if paused:
            gc.enable()
        assert res.ok, res.errors[:3]
        fresh = W.MapWriter(maps)
        t = time.perf_counter()
        fresh.restore()
        restore = time.perf_counter() - t
        t = time.perf_counter()
        assert fresh.apply(desired).writes == 0
        diff = time.perf_counter() - t
        return {"cold_apply_s": round(cold, 3), "restore_s": round(restore, 3),
                "full_diff_s": round(diff, 3), "map_writes": res.writes}
    finally:
        batch.BATCH_MIN = saved
        for m in maps.values():
            m.close()
        bpf.cleanup()
        remove_pins(PINS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--endpoints", type=int, default=10)
    args = ap.parse_args()
    desired = table(args.services, args.endpoints)
    one, batch = run(desired, batched=False), run(desired, batched=True)
    paused = run(desired, batched=True, gc_paused=True)
    print(json.dumps({"services": args.services, "endpoints": args.endpoints,
                      "one_by_one": one, "batched": batch, "batched_gc_paused": paused,
                      "cold_apply_ratio": round(batch["cold_apply_s"] / one["cold_apply_s"], 2)},
                     indent=1))


if __name__ == "__main__":
    main()
