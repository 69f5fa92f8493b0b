"""The pure core: no torch import. Min-cut solver and max-flow, frontier, segments,
the peak simulator, reachability, and the replay of a compiled step's allocations."""
