"""Analysis: an fx joint graph lowered to facts (``JointGraph``).

=============== ===============================================================================
joint_graph     ``JointGraph`` (frozen) and ``analyze``, the stage's entry point
halves          which nodes the forward and the backward compute
op_facts        the ``OpFacts`` (``remat.policy``) of one op; the view facts (``returns_alias``, ``view_root``)
provenance      module paths, repeated blocks, source lines
normalization   the normalization-boundary rule's facts (statistics, boundaries)
schedule        the ``Schedule`` the peak simulator replays; Note [Eager kernels]
ops             the op-family tables (matmul, attention, random, ...) and op names
cost            bytes, FLOPs and recompute-time estimates (``remat.device.DeviceModel``)
cse             common-subexpression elimination, before planning
=============== ===============================================================================
"""
