"""What a new user gets wrong at the entry points gets one ``remat:`` error that says what was
expected, what was given and how to fix it, never a raw error from inside (issue 29, item 6)."""

import warnings

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


@pytest.mark.parametrize("text, fix", [("0.5", r"pass the float budget=0\.5 for that fraction"),
                                       ("1", r"pass the float budget=1\.0 for that fraction"),
                                       ("1.5", r"a whole number of bytes; name a unit \('1\.5GiB'\)")])
def test_budget_string_without_a_unit_that_is_not_whole_bytes(text, fix):
    """A string is bytes: '0.5' said "bytes must be positive" (half a byte); it says to pass the
    float for a fraction (README: the budget row)."""
    with pytest.raises(remat.RematError, match=rf"^remat: budget must be .*got '{text}': .*{fix}"):
        remat.checkpoint(mlp(), budget=text)
    assert remat.Options(budget="1000000").budget.nbytes == 10**6  # a whole number is bytes


@pytest.mark.parametrize("entry", [remat.checkpoint, remat.explain, remat.pareto])
def test_a_class_in_place_of_a_model(entry):
    """``remat.checkpoint(nn.Linear)`` was accepted (a class is callable) and failed at the call."""
    with pytest.raises(remat.RematError, match=rf"^remat: {entry.__name__} expects an nn.Module instance or a "
                                               rf"function, got the class Linear itself\. Pass an instance: "
                                               rf"remat\.{entry.__name__}\(Linear\(\.\.\.\)"):
        entry(nn.Linear)


@pytest.mark.parametrize("pattern, why", [
    ("aten.gelux", r"torch\.ops\.aten has no op 'gelux' \(did you mean 'aten\.gelu'\?\)"),
    ("aten.gelu.fast", r"aten\.gelu has no overload 'fast' \(it has default, out\)"),
    ("gelu", r"it has no namespace \(did you mean 'aten\.gelu'\?\)"),
    ("nolib.gelu", r"torch\.ops\.nolib has no op 'gelu'"),
])
def test_a_policy_naming_no_op_is_refused_when_made(pattern, why):
    """An unknown op name was accepted and only warned "matched no op" when a graph was planned."""
    with pytest.raises(remat.PolicyError, match=rf"^remat: policy op pattern '{pattern}' names no op: {why}\. "
                                                r"Expected an op as the joint graph names it"):
        remat.save(ops=pattern)


def test_policy_op_names_that_are_checked_and_pass():
    rules = [remat.save(ops=p) for p in ("aten.gelu", "aten.mm.default", "aten._to_copy", "getitem",
                                         "prims.convert_element_type.default", "higher_order.flex_attention",
                                         "aten.gelux*")]  # a wildcard is not checked
    assert [r.ops for r in rules][-1] == ("aten.gelux*",)


def test_a_policy_rule_that_raises():
    """A rule that raised was taken for a planning failure: one warning, the fallback plan, and
    training went on without remat. The user's rule is broken: it raises, naming rule and op."""

    def picky(op):
        return {"aten.mm.default": remat.MUST_SAVE}[op.op]  # KeyError on every other op

    message = (r"^remat: policy rule `picky` raised KeyError at tests/entry/test_entry_errors\.py:\d+ \(picky\) "
               r"on op \w+ \([\w.]+, module '[\w.]*'\): '[\w.]+'\. A rule is called on every op")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="remat:")  # and no "planning failed" warning
        with pytest.raises(remat.PolicyError, match=message):
            remat.checkpoint(mlp(), backend="eager", policy=picky)(torch.randn(3, 4))
        with pytest.raises(remat.PolicyError, match=message):
            remat.explain(mlp(), torch.randn(3, 4), policy=picky)


def test_compiled_plans_of_torch_compile_with_the_remat_backend():
    # torch.compile(model, backend="remat") trains under remat, but its plans belong to no model
    # remat can name: compiled_plans says so and names remat.checkpoint (issue 29, item 9).
    model = mlp()
    compiled = torch.compile(model, backend="remat", options={"backend": "eager"})
    compiled(torch.randn(3, 4)).sum().backward()
    with pytest.raises(remat.RematError, match=r"^remat: compiled_plans expects a model returned by "
                                               r"remat.checkpoint, got the OptimizedModule torch.compile returned"
                                               r".*Use model = remat.checkpoint\(model\) instead"):
        remat.compiled_plans(compiled)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"remat: torch.compile\(backend='remat', options=...\) takes "
                                        r"remat.checkpoint's options .*got bakend"):
        torch.compile(mlp(), backend="remat", options={"bakend": "eager"})(torch.randn(3, 4))
    torch._dynamo.reset()
