"""The uncompiled backend: the partitioned graphs run op by op."""
