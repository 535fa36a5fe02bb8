"""Everything that touches the kernel, by job: load/ (compile, load and attach the programs),
maps/ (layouts, codecs and typed access to the pinned maps), write/ (applying a desired state),
flows/ (the TC path's conntrack), upgrade/ (adopt, resize, downgrade), sockets/ (stale-socket
handling)."""
