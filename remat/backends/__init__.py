"""Backends: how the partitioned graphs run (the ``Backend`` interface, the
registry, the uncompiled backend and Inductor)."""
