"""The `kproxy-ebpf` command (and the kubectl plugin): every subcommand, mounting the lab and
the benchmarks when they are installed.

    main.py       the root group and the entry point; mount.py: `lab`/`bench` on demand
    node.py       status, stats        services.py  services      maps.py  maps ..., ct ...
    check.py      check                trace.py     trace         watch.py watch
    cleanup.py    cleanup (kproxy's pins, or kube-proxy's leftovers)
    options.py, output.py, pinned.py, names.py: the options, printing, map reads and
                  kubectl's manners the commands share
"""
