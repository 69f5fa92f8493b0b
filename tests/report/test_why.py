"""``plan.explain(name)``: one sentence per kind of reason, naming the rule or the cut."""

import pytest

import remat
from remat.plan import Plan, PlanNode, SavedTensor
from remat.policy import BUILTIN_RULES


def test_min_cut_boundary(report_plan):
    text = report_plan.explain("mul")
    assert text.startswith("`mul` (aten.mul.Tensor in module `layers.0.ln`, 512 B) (report_model.py:24) is saved by "
                           "the min-cut (no rule forces it)")
    assert "recomputes `mul_1` from it" in text


def test_builtin_rules_that_save(report_plan):
    text = report_plan.explain("addmm")
    assert "is saved: rule `matmul` (matmuls and convolutions are compute-bound" in text
    assert "is saved: rule `random op` (recomputing would draw fresh random numbers" in report_plan.explain("rand_1")


def test_user_rule(report_plan):
    assert "is saved: user rule `must_save(layers.*.act)` forbids recomputing it" in report_plan.explain("tanh")


def test_recomputed_by_the_cut_and_by_the_view_rule(report_plan):
    assert report_plan.explain("gelu") == (
        "`gelu` (aten.gelu.default in module `layers.0`, 1.00 KiB) (report_model.py:25) is recomputed in the "
        "backward from `addmm`: the min-cut found recomputing it cheaper in bytes than saving its 1.00 KiB.")
    text = report_plan.explain("permute")
    assert "is recomputed in the backward from `primals_4`: rule `view` (a view keeps its base's" in text


def test_other_statuses(report_plan):
    assert "computed in the forward only and not saved" in report_plan.explain("var_mean")
    assert "rule `reduction`" in report_plan.explain("var_mean")
    assert "graph input the backward does not read" in report_plan.explain("primals_3")
    assert "parameter or buffer the backward reads: saved at no cost" in report_plan.explain("primals_1")
    assert "parameter or buffer the backward does not read" in report_plan.explain("primals_5")
    assert report_plan.explain("tangents_1") == "`tangents_1` is an incoming gradient (tangent) of the backward."
    assert "part of the backward: it depends on the incoming gradients" in report_plan.explain("mm")
    assert "only for the backward: the forward never computes it" in report_plan.explain("alias")


def test_op_query(report_plan):
    assert report_plan.explain("aten.gelu.default") == report_plan.explain("aten.gelu").replace(
        "aten.gelu:", "aten.gelu.default:")
    assert report_plan.explain("aten.gelu").startswith("aten.gelu: 3 nodes: recomputed x3 (`gelu`, `gelu_1`, `gelu_2`)")


def test_unknown_name(report_plan):
    with pytest.raises(remat.RematError, match=r"^remat: plan.explain expects the name of a node .* got `mull`\. "
                                               r"Close matches: mul"):
        report_plan.explain("mull")
    with pytest.raises(remat.RematError, match=r"^remat: plan.explain expects a node name \(str\)"):
        report_plan.explain(3)


def synthetic(reason, status="saved", op="aten.foo.default"):
    """A two-node plan: ``x`` (a graph input) -> ``v`` (with ``reason``) read by the backward's ``g``."""
    nodes = (
        PlanNode("x", "input", (4,), "float32", 16, status="input", reason="graph input"),
        PlanNode("v", op, (4,), "float32", 16, "blk", status=status, reason=reason, inputs=("x",)),
        PlanNode("tangents_1", "tangent", status="tangent"),
        PlanNode("g", "aten.mul.Tensor", status="backward", inputs=("tangents_1", "v")),
    )
    saved = (SavedTensor("v", op, (4,), "float32", 16, "blk", reason=reason),) if status == "saved" else ()
    rec = ("v",) if status == "recomputed" else ()
    return Plan(saved, rec, (op,) * len(rec), nodes=nodes)


@pytest.mark.parametrize("rule", [r for r in BUILTIN_RULES if r.decision is remat.MUST_SAVE], ids=lambda r: r.name)
def test_every_builtin_save_rule(rule):
    text = synthetic(rule.name).explain("v")
    assert text == (f"`v` (aten.foo.default in module `blk`, 16 B) is saved: rule `{rule.name}` ({rule.description}) "
                    "forbids recomputing it, and the backward needs it; the backward reads it in `g`.")


@pytest.mark.parametrize("rule", [r for r in BUILTIN_RULES if r.decision is remat.MUST_RECOMPUTE],
                         ids=lambda r: r.name)
def test_every_builtin_recompute_rule(rule):
    text = synthetic(rule.name, status="recomputed").explain("v")
    assert text == (f"`v` (aten.foo.default in module `blk`, 16 B) is recomputed in the backward from `x`: "
                    f"rule `{rule.name}` ({rule.description}) forbids saving it.")


def test_user_recompute_rule_and_saved_graph_input():
    text = synthetic("user rule `r`", status="recomputed").explain("v")
    assert text.endswith("is recomputed in the backward from `x`: user rule `r` forbids saving it.")
    text = synthetic("graph input", op="input").explain("v")
    assert "is a graph input the backward reads; it cannot be recomputed, so it is saved" in text


def test_fallback_plan():
    plan = Plan(saved=(), recomputed=(), fallback="RuntimeError: boom")
    assert plan.explain("mul") == ("This plan fell back to saving what autograd saves (RuntimeError: boom); "
                                   "nothing was decided about `mul`.")
