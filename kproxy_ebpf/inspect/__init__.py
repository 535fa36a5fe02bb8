"""The cluster against the maps, for operators: check, trace, watch and the cross-node check."""
