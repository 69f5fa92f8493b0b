"""Which values Inductor stores in memory, and how its kernels allocate them: the pure model
the Inductor step model (``remat.backends.inductor.kernel_model``) replays. Pure: no torch import.

The uncompiled backend runs the joint graph op by op: every op's output is a tensor. Inductor
lowers each graph (the forward, and the backward with its recompute) into kernels, and most
values never reach memory. Two stages, one module each, under one set of device rules
(``rules``: ``FusionRules``, every Inductor threshold the model copies):

* ``realization``: ``lower`` decides, for one graph, which values become *buffers* and which
  are inlined into the kernels that read them (Note [Inductor realization]);
* ``allocation``: ``kernels`` groups the lowered graph into the kernels the simulator replays,
  each with the storages it allocates before it runs and the storages it reads (Note [Inductor
  allocation]); ``reuse`` decides which freed buffer a later one takes (Note [Reuse estimate]).

The facts they read per node are ``remat.backends.inductor.facts.NodeLowering``, one graph at a
time as a ``FusionGraph``.
"""

from .allocation import Kernel, kernels, storage_of
from .realization import Lowered, lower
from .rules import CPU, GPU, FusionRules, replace_rules, rules_for

__all__ = ["FusionRules", "CPU", "GPU", "rules_for", "replace_rules", "Lowered", "lower", "Kernel", "kernels",
           "storage_of"]
