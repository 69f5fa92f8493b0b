"""What a new user gets wrong at the entry points gets one ``remat:`` error that says what was
expected, what was given and how to fix it, never a raw error from inside (issue 29, item 6)."""

import pytest
import torch
import torch.nn as nn

import remat


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_explain_without_inputs():
    with pytest.raises(remat.RematError, match=r"^remat: the model takes \(input\) and was called with no inputs: "
                                               r"missing a required argument: 'input'\. Nothing was planned\. Pass "
                                               r"the inputs of a training step after the model") as e:
        remat.explain(mlp())
    assert e.value.__cause__ is None and e.value.__suppress_context__
    with pytest.raises(remat.RematError, match=r"^remat: the model takes \(input\) and was called with no inputs"):
        remat.checkpoint(mlp(), backend="eager")()
    with pytest.raises(remat.RematError, match=r"^remat: the model takes \(x, w\) and was called with "
                                               r"\(Tensor\(2, 4\) float32, y=int\): "):
        remat.explain(lambda x, w: (x @ w).tanh(), torch.randn(2, 4, requires_grad=True), y=3)


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.inductor)])
def test_input_of_the_wrong_dtype(backend):
    """An int64 input into a float model: the compiled forward raised the kernel's RuntimeError
    from about 29 frames inside torch, where a wrong shape already got a remat: error."""
    x = torch.ones(3, 4, dtype=torch.int64)
    message = (r"^remat: the model raises RuntimeError on these inputs, also without remat, so the error is the "
               r"model's, not remat's: mat1 and mat2 must have the same dtype, but got Long and Float\. Inputs: "
               r"\(Tensor\(3, 4\) int64\)\. Fix the inputs' shapes or dtypes")
    with pytest.raises(remat.RematError, match=message) as e:
        remat.checkpoint(mlp(), backend=backend)(x)
    assert e.value.__cause__ is None and e.value.__suppress_context__
    with pytest.raises(remat.RematError, match=message):
        remat.explain(mlp(), x, backend=backend)
