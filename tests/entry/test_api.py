"""Public API: wrapping, state_dict keys, copies, the registered backend, explain, errors."""

import copy
import pickle
import re
import warnings

import pytest
import torch
import torch.nn as nn

import remat
from remat.capture.wrap import backend_of
from zoo import workloads

from ..conftest import train_step


def test_wrapped_module_shares_parameters_and_state_dict_keys():
    model, x = workloads.build("mlp")
    rm = remat.checkpoint(model, backend="eager")
    assert list(rm.state_dict()) == list(model.state_dict())
    assert all(a is b for a, b in zip(rm.parameters(), model.parameters()))
    opt = torch.optim.SGD(rm.parameters(), lr=0.1)
    before = model[0].fc1.weight.detach().clone()
    workloads.loss(rm(x)).backward()
    opt.step()
    assert not torch.equal(before, model[0].fc1.weight)  # the optimizer updated shared params


def test_function_is_wrapped_as_function():
    def f(x, w):
        return torch.tanh(x @ w).sigmoid()

    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    g = remat.checkpoint(f, backend="eager")
    out = g(x, w)
    out.sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    f(x, w).sum().backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)
    assert len(remat.compiled_plans(g)) == 1


@pytest.mark.inductor
def test_registered_backend_name():
    model, x = workloads.build("pointwise")
    ref = train_step(copy.deepcopy(model), x)
    got = train_step(torch.compile(copy.deepcopy(model), backend="remat"), x)
    torch.testing.assert_close(got[0], ref[0], atol=2e-5, rtol=2e-4)
    for k in ref[2]:
        torch.testing.assert_close(got[2][k.removeprefix("_orig_mod.")] if k in got[2] else
                                   got[2]["_orig_mod." + k], ref[2][k], atol=2e-5, rtol=2e-4)


def test_entry_point_declared():
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group="torch_dynamo_backends")}
    assert names.get("remat") == "remat.capture.dynamo_backend:remat_backend"


def test_explain_matches_compiled_plan():
    model, x = workloads.build("gpt")
    rm = remat.checkpoint(model, backend="eager")
    explained = remat.explain(rm, x)
    torch._dynamo.reset()
    workloads.loss(rm(x)).backward()
    assert remat.compiled_plans(rm) == [explained]
    unwrapped = remat.explain(model, x, backend="eager")  # the unwrapped model
    # Dynamo traces the wrapped copy with a few more alias nodes; the decision is the same.
    assert str(unwrapped) == str(explained)
    # Inductor plans the same model with GELU decomposed (the uncompiled backend keeps it whole,
    # Note [Eager GELU]).
    inductor = remat.explain(model, x)
    assert "aten.erf.default" in {n.op for n in inductor.nodes}
    assert "aten.erf.default" not in {n.op for n in explained.nodes}


def test_no_plan_without_grad_or_in_eval():
    model, x = workloads.build("mlp")
    rm = remat.checkpoint(model, backend="eager")
    with torch.no_grad():
        rm(x)
    rm.eval()
    rm(x.detach())
    assert remat.compiled_plans(rm) == []
    with pytest.raises(remat.RematError, match="^remat: explain found no training graph"):
        with torch.no_grad():
            remat.explain(lambda a: a * 2, torch.randn(3))


def test_train_eval_toggle():
    model, x = workloads.build("mlp")
    rm = remat.checkpoint(model, backend="eager")
    rm.eval()
    assert not model[0].training  # submodules are shared
    assert not model.training  # and the original's own flag follows
    assert not any(m.training for m in model.modules())
    rm.train()
    assert model.training and rm.training
    workloads.loss(rm(x)).backward()
    assert len(remat.compiled_plans(rm)) == 1


# --- copies --------------------------------------------------------------------------------

def test_deep_copy_stays_wrapped_with_plans_of_its_own():
    """issue 29, item 1: ``nn.Module.__getstate__`` drops the compiled call, so a deep copy
    trained as plain eager (no plan, no warning) and ``compiled_plans`` on it said torch.compile
    was applied over it (Note [Copies are wrapped anew])."""
    model, x = workloads.build("mlp")
    rm = remat.checkpoint(model, backend="eager", budget="1GiB")
    workloads.loss(rm(x)).backward()
    copied = copy.deepcopy(rm)
    assert remat.compiled_plans(copied) == []  # a backend of its own: nothing compiled yet
    assert backend_of(copied) is not backend_of(rm) and backend_of(copied).options == backend_of(rm).options
    assert not any(a is b for a, b in zip(copied.parameters(), rm.parameters()))
    assert list(copied.state_dict()) == list(model.state_dict())
    assert_trains(copied, model, x)
    assert len(remat.compiled_plans(copied)) == 1 and len(remat.compiled_plans(rm)) == 1
    assert str(remat.compiled_plans(copied)[0]) == str(remat.compiled_plans(rm)[0])
    copied.eval()  # the copy's original follows the copy, the model stays as it was
    assert rm.training and model.training and not copied.training
    assert not any(m.training for m in copied.modules())


def test_pickle_and_torch_save_keep_the_model_wrapped(tmp_path):
    """issue 29, item 2: pickling failed on a weak reference (a raw TypeError); the loaded model
    is wrapped anew, with the same options, and plans its graphs on its first step."""
    model, x = workloads.build("mlp")
    rm = remat.checkpoint(model, backend="eager", budget="1GiB", policy=remat.save(ops="aten.gelu"))
    workloads.loss(rm(x)).backward()
    torch.save(rm, tmp_path / "model.pt")
    for loaded in (pickle.loads(pickle.dumps(rm)), torch.load(tmp_path / "model.pt", weights_only=False)):
        assert remat.compiled_plans(loaded) == []
        assert backend_of(loaded).options == backend_of(rm).options
        assert_trains(loaded, model, x)
        assert str(remat.compiled_plans(loaded)[0]) == str(remat.compiled_plans(rm)[0])


def test_pickling_a_rule_pickle_cannot_save_is_a_remat_error():
    rm = remat.checkpoint(nn.Linear(2, 2), backend="eager", policy=lambda op: None)
    with pytest.raises(remat.PolicyError, match=r"^remat: pickling policy rule `<lambda>` needs its function "
                                                r"pickled.*model.state_dict\(\)"):
        pickle.dumps(rm)
    assert remat.compiled_plans(copy.deepcopy(rm)) == []  # a deep copy shares the rule


def test_plan_table_mentions_every_saved_tensor():
    model, x = workloads.build("mlp")
    plan = remat.explain(model, x)
    text = str(plan)
    assert text.startswith("remat plan:")
    for s in plan.saved:
        if s.op != "parameter":
            assert s.name in text


# --- bad input -------------------------------------------------------------------------------

def test_error_not_a_module_or_callable():
    with pytest.raises(remat.RematError, match=r"^remat: checkpoint expects an nn.Module or a callable, got int"):
        remat.checkpoint(3)


def test_error_unknown_backend():
    with pytest.raises(remat.RematError, match=r"^remat: backend must be one of .*got 'cuda'.*backend='eager'"):
        remat.checkpoint(nn.Linear(2, 2), backend="cuda")


def test_error_policy_wrong_type():
    with pytest.raises(remat.PolicyError, match=r"^remat: policy must be None, a rule"):
        remat.checkpoint(nn.Linear(2, 2), policy=42)


def test_error_policy_returns_wrong_type():
    model, x = workloads.build("mlp")
    with pytest.raises(remat.PolicyError, match=r"^remat: policy rule `bad` returned 'yes'.*expected remat.MUST_SAVE"):
        def bad(op):
            return "yes"

        remat.explain(remat.checkpoint(model, backend="eager", policy=bad), x)


def test_error_contradictory_rules():
    model, x = workloads.build("mlp")
    rules = [remat.save(ops="aten.gelu", name="keep-gelu"), remat.recompute(modules="*", name="all")]
    with pytest.raises(remat.PolicyError, match=r"^remat: contradictory policy rules .*`keep-gelu`.*`all`.*Narrow"):
        remat.explain(remat.checkpoint(model, backend="eager", policy=rules), x)


def test_error_recompute_random_op():
    # Uniform noise is not among the random ops remat replays (dropout is: Note [Replayed
    # random ops]), so recomputing it would draw other numbers.
    def f(x):
        return (x * torch.rand_like(x)).tanh()

    rule = remat.recompute(ops=("aten.rand*", "aten.bernoulli"))
    g = remat.checkpoint(f, backend="eager", policy=rule)
    with pytest.raises(remat.PolicyError, match=r"^remat: .*random op; recomputing it would give wrong results"):
        remat.explain(g, torch.randn(4, 4, requires_grad=True))


def test_error_conflict_names_nodes_and_rules():
    model, x = workloads.build("mlp")
    # The layer norm statistics are outputs of var_mean, a reduction (never recomputed) with two
    # outputs (never saved whole); forbidding to save its outputs and everything computed from
    # them leaves no valid plan.
    policy = remat.recompute(ops=("getitem", "aten.add", "aten.sub", "aten.mul", "aten.rsqrt", "aten.div"),
                             modules="*.ln", name="no-getitem")
    with pytest.raises(remat.PlanningError, match=r"^remat: no valid plan: .*var_mean .*cannot be recomputed "
                       r"\(reduction\).*getitem.*user rule `no-getitem`.*Remove or narrow"):
        remat.explain(remat.checkpoint(model, backend="eager", policy=policy), x)


def test_user_rule_forces_recompute_and_save():
    model, x = workloads.build("mlp")
    base = remat.explain(model, x)
    forced = remat.explain(remat.checkpoint(model, backend="eager",
                                            policy=remat.save(ops="aten.gelu")), x)
    assert "aten.gelu.default" not in forced.recompute_counts()
    # The GELU's output is kept (the uncompiled backend keeps the op whole: Note [Eager GELU]):
    # one more hidden-size tensor per block.
    assert forced.saved_bytes > base.saved_bytes


def test_rule_matching_nothing_warns_at_the_users_line():
    model, x = workloads.build("mlp")
    rule = remat.save(ops="aten.convolution")  # an op, not in this model
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        remat.explain(remat.checkpoint(model, backend="eager", policy=rule), x)
        rm = remat.checkpoint(model, backend="eager", policy=rule)
        rm(x)
    hits = [m for m in w if "matched no op" in str(m.message)]
    assert len(hits) == 2 and all(str(m.message).startswith("remat:") for m in hits)
    assert {m.filename for m in hits} == {__file__}


def test_error_wrong_input_shape_is_one_remat_error(capfd):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 5)
    message = (r"^remat: the model raises RuntimeError on these inputs, also without remat, so nothing was "
               r"planned: mat1 and mat2 shapes cannot be multiplied \(3x5 and 4x8\)\. Inputs: \(Tensor\(3, 5\) "
               r"float32\)\. Fix the inputs' shapes")
    with pytest.raises(remat.RematError, match=message) as e:
        remat.checkpoint(model, backend="eager")(x)
    assert e.value.__cause__ is None and e.value.__suppress_context__
    with pytest.raises(remat.RematError, match=message):
        remat.explain(model, x)
    assert "fake_tensor" not in capfd.readouterr().err  # no log lines from Dynamo's fake tensors


def test_error_in_users_forward_names_its_line():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return x @ self.w  # the wrong shape fails here

    with pytest.raises(remat.RematError, match=r"^remat: the model raises RuntimeError at tests/entry/test_api.py:\d+ "
                                               r"\(forward\) on these inputs"):
        remat.checkpoint(Bad(), backend="eager")(torch.randn(2, 3, requires_grad=True))


def test_explain_takes_checkpoint_options_not_the_models():
    model, x = workloads.build("mlp")
    # backend= is an option of explain (as of checkpoint), not a keyword argument of forward.
    plan = remat.explain(model, x, backend="eager")
    assert plan == remat.explain(remat.checkpoint(model, backend="eager"), x)
    assert plan != remat.explain(model, x)  # default: Inductor, which plans a GELU decomposed
    forced = remat.explain(model, x, policy=remat.save(ops="aten.erf"))
    assert "aten.erf.default" not in forced.recompute_counts()


def test_error_policy_with_wrong_signature_at_checkpoint_time():
    def two_args(op, extra):
        return None

    with pytest.raises(remat.PolicyError, match=r"^remat: a policy callable is called with one argument, a "
                                                r"remat.OpInfo.*got `two_args\(op, extra\)`.*def two_args\(op\)"):
        remat.checkpoint(nn.Linear(2, 2), policy=two_args)
    with pytest.raises(remat.PolicyError, match=r"got `<lambda>\(\)`"):
        remat.checkpoint(nn.Linear(2, 2), policy=[remat.save(ops="aten.mm"), lambda: None])


def test_fallback_warns_and_strict_raises(monkeypatch):
    from remat.planning import planner

    def boom(*a, **k):
        raise ValueError("synthetic failure")

    monkeypatch.setattr(planner, "solve", boom)
    model, x = workloads.build("mlp")
    with pytest.warns(UserWarning, match="^remat: planning failed"):
        rm = assert_trains(remat.checkpoint(copy.deepcopy(model), backend="eager"), model, x)
    assert remat.compiled_plans(rm)[0].fallback.startswith("ValueError")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="strict=True"):
        remat.checkpoint(copy.deepcopy(model), backend="eager", strict=True)(x)


def assert_trains(rm, model, x):
    ref = train_step(copy.deepcopy(model), x)
    got = train_step(rm, x)
    torch.testing.assert_close(got[0], ref[0])
    for k in ref[2]:
        torch.testing.assert_close(got[2][k], ref[2][k])
    return rm


def test_compiled_plans_say_which_inputs_each_plan_runs_for():
    # issue 29 item 11: a Dynamo recompile adds a plan; each says the inputs it was compiled for
    # (symbolic sizes where Dynamo made them dynamic), parameters left out; explain's plan does not.
    import torch.nn as nn

    torch._dynamo.reset()
    m = remat.checkpoint(nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2)), backend="eager")
    m(torch.randn(3, 4)).sum().backward()
    m(torch.randn(5, 4)).sum().backward()
    first, second = remat.compiled_plans(m)
    assert first.compiled_for == "3x4 float32" and "\ncompiled for inputs: 3x4 float32\n" in str(first)
    assert re.fullmatch(r"SymInt (s\d+), \1x4 float32", second.compiled_for), second.compiled_for
    assert remat.explain(m, torch.randn(3, 4)).compiled_for == ""
    assert remat.Plan.combine([first, second]).compiled_for == f"g0: 3x4 float32; g1: {second.compiled_for}"


def _pickled_step(x):
    return (x.sin() * 2).cos().sum()


def rebound_step(x):
    return (x.tanh() * 3).exp().sum()


rebound_step = remat.checkpoint(rebound_step, backend="eager")


def test_a_wrapped_function_pickles():
    # Note [Pickling a wrapped function]: g = checkpoint(f) pickled to a raw "not the same object
    # as f"; it unpickles wrapped anew, with its own plans; f = checkpoint(f) unpickles to the
    # module's own wrapper; a lambda gets a remat: error.
    torch._dynamo.reset()
    g = remat.checkpoint(_pickled_step, backend="eager")
    x = torch.randn(4, 3, requires_grad=True)
    g(x).backward()
    h = pickle.loads(pickle.dumps(g))
    assert h is not g and remat.compiled_plans(h) == [] and len(remat.compiled_plans(g)) == 1
    y = x.detach().clone().requires_grad_()
    h(y).backward()
    assert len(remat.compiled_plans(h)) == 1 and torch.equal(y.grad, x.grad)
    assert pickle.loads(pickle.dumps(rebound_step)) is rebound_step
    with pytest.raises(remat.RematError, match=r"^remat: pickling a remat.checkpoint-wrapped function pickles "
                                               r"its function by name.*<lambda>.*Define the function at module level"):
        pickle.dumps(remat.checkpoint(lambda t: t.sin().sum(), backend="eager"))
