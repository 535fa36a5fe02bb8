"""The model: the lean API types kube/ builds (objects), the desired datapath proxy/ computes
and datapath/ applies (desired), and the Maglev table both share (maglev). Imports nothing of
the package."""
