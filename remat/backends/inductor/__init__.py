"""Everything remat knows about Inductor's internals, in one package, behind the backend
interface (``remat.backends.base.Backend``):

* ``backend``: ``InductorBackend``, the interface's Inductor implementation;
* ``hooks``: how remat's partition reaches Inductor and how Inductor's fusion is kept within a
  block (runtime patches, each with the torch versions it was checked on);
* ``lowering``: per-op lowering facts (extern kernels, inlined expressions, scratch);
* ``fusion``: the pure model of which values Inductor stores and how its kernels allocate;
* ``kernel_model``: the simulator's step model that replays a step kernel by kernel;
* ``decompositions``: Inductor's decomposition table (both backends trace with it);
* ``versions``: the verified torch versions and the drift warnings (Note [Version drift]).

No module outside this package imports ``torch._inductor`` (tests/test_architecture.py).
"""

from .backend import InductorBackend

__all__ = ["InductorBackend"]
