"""``wrapper_reading._aliased``: which fallback kernels of a compiled graph allocate nothing
because their output is an alias of an input (remat's offload ``ready``), read from the op's
schema. A higher-order op (an RNG replay's) has no schema: it allocates, and that is no drift of
torch's API (on the H100, torch 2.11, GPT-2 with replayed dropout warned that
``read_offload_copies`` could not be used)."""

from __future__ import annotations

import warnings

import torch

from remat.backends.inductor.wrapper_reading import _aliased


class _Fallback:
    def __init__(self, op, aliases=()):
        self.op_overload = op
        self._aliases = list(aliases)

    def get_inputs_that_alias_output(self):
        return self._aliases


def test_an_op_whose_schema_returns_an_input_allocates_nothing():
    assert _aliased(_Fallback(torch.ops.aten.view.default, ["buf3"])) == "buf3"
    assert _aliased(_Fallback(torch.ops.aten.add.Tensor)) is None  # a fresh output
    assert _aliased(_Fallback(torch.ops.aten.add_.Tensor, ["buf1"])) is None  # written in place: not a free alias


def test_a_higher_order_op_or_none_allocates_without_a_drift_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _aliased(_Fallback(torch.ops.higher_order.run_and_save_rng_state)) is None
        assert _aliased(_Fallback(None)) is None
        assert _aliased(object()) is None
