"""Everything remat knows about Inductor's internals, in one package, behind the backend
interface (``remat.backends.base.Backend``):

* ``backend``: ``InductorBackend``, the interface's Inductor implementation;
* ``hooks``: how remat's partition reaches Inductor and how Inductor's fusion is kept within a
  block (runtime patches);
* ``lowering``: per-op lowering facts read from fx nodes (``facts.NodeLowering``: how each op is
  lowered, what it adds to an inlined expression);
* ``facts``: those facts' types (``Kind``, ``NodeLowering``, ``FusionGraph``), pure;
* ``fusion/``: the pure model of which values Inductor stores and how its kernels allocate;
* ``kernel_model``: the simulator's step model that replays a step kernel by kernel;
* ``decompositions``: Inductor's decomposition table (both backends trace with it);
* ``wrapper_reading``: the compiled step's memory plan, read from Inductor's wrapper.

Every Inductor internal they use or copy is an entry of the version table (``remat.versions``:
the torch versions it was checked on, what remat does when it drifts, Note [Version drift]).

No module outside this package imports ``torch._inductor`` (tests/structure/test_architecture.py).
"""

from .backend import InductorBackend

__all__ = ["InductorBackend"]
