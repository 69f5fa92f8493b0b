"""Capture: how a model's training step reaches remat (the Dynamo backend, the
AOTAutograd partition hook, module wrapping, DDP bucket splits, and the attention rewrite that
gives each Dynamo graph's SDPA calls eager's arguments: ``attention``)."""
