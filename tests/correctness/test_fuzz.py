"""Fuzzing (issue 4).

1. Random modules (linear, conv, norms, pointwise chains, residuals, dropout, views, in-place
   ops, reused parameters) trained one step from the same seed with remat (uncompiled backend),
   with a plan that recomputes nothing, and with eager autograd: outputs, every gradient and
   every buffer of remat must equal the recompute-nothing plan's bit for bit and eager's up to
   float32 rounding, and no graph may fall back. ``MODULE_CASES`` cases run in CI
   (hypothesis, derandomized).
2. Random constraint combinations for the solver: a random problem either gets a valid plan
   of minimum cost or a ``ConflictError`` exactly when no valid plan exists, and random user
   policies on a real joint graph always give a plan or a ``RematError``: never a raw
   networkx (or other) exception.
"""

from __future__ import annotations

import collections
import copy
import warnings

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import remat
from remat.backends.registry import backend_for
from remat.capture.partition import make_partition_fn
from remat.core.solver import ConflictError, Problem, brute_force, recompute_closure, solve
from remat.options import Options

EAGER = backend_for("eager")
"""The backend the partition tests plan and lower with (and simulate eager autograd with)."""

MODULE_CASES = 200
C, L = 4, 6  # channels and length of the (batch, C, L) activations

# --- 1. random modules ---------------------------------------------------------------------------

POINTWISE = {
    "relu": F.relu, "gelu": F.gelu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "silu": F.silu,
    "sin": torch.sin, "softplus": F.softplus, "square": lambda x: 0.5 * x * x,
    "exp": lambda x: torch.exp(x.clamp(max=3.0)),
}

KINDS = ("linear", "conv", "layernorm", "batchnorm", "groupnorm", "rmsnorm", "pointwise",
         "residual", "dropout", "transpose_linear", "reshape", "slice_cat", "chunk", "inplace",
         "inplace_view", "reuse", "param_scale", "softmax")


def layer_spec():
    simple = st.sampled_from(KINDS)
    chain = st.lists(st.sampled_from(sorted(POINTWISE)), min_size=1, max_size=4).map(tuple)
    return st.tuples(simple, chain, st.sampled_from((0.1, 0.5)), st.integers(0, 3))


def model_spec():
    return st.lists(layer_spec(), min_size=1, max_size=6)


class Fuzzed(nn.Module):
    """A module built from a spec: a list of (kind, pointwise chain, probability, variant)."""

    def __init__(self, spec):
        super().__init__()
        self.spec = list(spec)
        self.layers = nn.ModuleList(self._make(kind) for kind, *_ in self.spec)
        self.shared = nn.Linear(L, L)  # the "reuse" layers all use this one
        self.g = nn.Parameter(torch.randn(C, 1) * 0.5 + 1.0)

    @staticmethod
    def _make(kind):
        return {
            "linear": lambda: nn.Linear(L, L),
            "conv": lambda: nn.Conv1d(C, C, 3, padding=1),
            "layernorm": lambda: nn.LayerNorm(L),
            "batchnorm": lambda: nn.BatchNorm1d(C),
            "groupnorm": lambda: nn.GroupNorm(2, C),
            "transpose_linear": lambda: nn.Linear(C, C),
            "residual": lambda: nn.Linear(L, L),
        }.get(kind, nn.Identity)()

    def _pointwise(self, x, chain):
        for name in chain:
            x = POINTWISE[name](x)
        return x

    def forward(self, x):
        for layer, (kind, chain, p, variant) in zip(self.layers, self.spec):
            x = self._layer(layer, kind, chain, p, variant, x)
        return x

    def _layer(self, layer, kind, chain, p, variant, x):
        if kind in ("linear", "conv", "layernorm", "batchnorm", "groupnorm"):
            return layer(x)
        if kind == "rmsnorm":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.g
        if kind == "pointwise":
            return self._pointwise(x, chain)
        if kind == "residual":
            return x + self._pointwise(layer(x), chain)
        if kind == "dropout":
            return F.dropout(x, p, training=True)
        if kind == "transpose_linear":
            return layer(x.transpose(1, 2)).transpose(1, 2)
        if kind == "reshape":
            b = x.shape[0]
            return self._pointwise(x.reshape(b, -1), chain).view(b, C, L)
        if kind == "slice_cat":
            k = 1 + variant % (L - 1)
            return torch.cat([self._pointwise(x[..., :k], chain), x[..., k:] * 0.5], dim=-1)
        if kind == "chunk":
            a, b = x.chunk(2, dim=1)
            return torch.cat([self._pointwise(a, chain), b.flip(1)], dim=1)
        if kind == "inplace":
            y = x * 1.0
            if variant == 0:
                y.mul_(1.5)
            elif variant == 1:
                y.add_(self.g)
            elif variant == 2:
                y.relu_()
            else:
                y.sigmoid_()
            return y
        if kind == "inplace_view":
            y = x.clone()
            y[:, :1].mul_(2.0)
            y.transpose(1, 2)[..., -1:].add_(1.0)
            return self._pointwise(y, chain)
        if kind == "reuse":
            return self.shared(self._pointwise(self.shared(x), chain))
        if kind == "param_scale":
            return self._pointwise(x * self.g + self.g.sin(), chain)
        if kind == "softmax":
            return torch.softmax(x, dim=-1 if variant % 2 else 1)
        raise AssertionError(kind)


def one_step(model, x, seed):
    """Output, input gradient, parameter gradients and buffers after one step from ``seed``."""
    torch.manual_seed(seed)
    for q in model.parameters():
        q.grad = None
    x = x.detach().clone().requires_grad_()
    out = model(x)
    loss = out.float().square().mean() + out.float().sum() * 0.1
    loss.backward()
    grads = {n: q.grad for n, q in model.named_parameters()}
    return {"output": out.detach(), "input grad": x.grad, **grads,
            **{f"buffer {n}": b.clone() for n, b in model.named_buffers()}}


def compare(got, want, spec, exact):
    assert got.keys() == want.keys()
    for k, b in want.items():
        a = got[k]
        if b is None or a is None:
            assert a is None and b is None, (k, spec)
        elif exact:
            assert torch.equal(a, b), f"{k} of {spec}: max diff {(a - b).abs().max().item():.3g}"
        else:  # float32 rounding of two different programs; scaled by the gradient's size
            atol = 2e-4 * max(1.0, b.abs().max().item()) if b.is_floating_point() else 0
            torch.testing.assert_close(a, b, atol=atol, rtol=1e-3, msg=lambda m, k=k: f"{k} of {spec}: {m}")


def check_module(spec, seed=0):
    """The remat plan must equal, bit for bit, a plan that saves everything and recomputes
    nothing (same capture and decompositions): recompute may not change a single value. Both
    must match eager autograd up to float32 rounding (AOTAutograd's decomposed backward formulas
    round differently from eager's kernels)."""
    torch.manual_seed(seed)
    model = Fuzzed(spec)
    x = torch.randn(2, C, L)
    want = one_step(copy.deepcopy(model), x, seed + 1)
    runs = {}
    for name, policy in (("remat", None), ("keep-all", remat.save(ops="*"))):
        torch._dynamo.reset()
        rm = remat.checkpoint(copy.deepcopy(model), backend="eager", strict=True, policy=policy)
        runs[name] = one_step(rm, x, seed + 1)
        plans = remat.compiled_plans(rm)
        assert len(plans) == 1 and plans[0].fallback is None, (spec, [p.fallback for p in plans])
    compare(runs["remat"], runs["keep-all"], spec, exact=True)
    compare(runs["remat"], want, spec, exact=False)


COUNT = {"modules": 0}


@pytest.mark.xdist_group("fuzz-modules")  # with its guard below, on one worker (pytest-xdist --dist loadgroup)
@settings(max_examples=MODULE_CASES, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(model_spec())
def test_fuzz_random_modules_match_eager(spec):
    COUNT["modules"] += 1
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="remat:")  # any remat warning (a fallback) fails
        check_module(spec, seed=COUNT["modules"])


@pytest.mark.xdist_group("fuzz-modules")
def test_fuzz_ran_enough_module_cases():
    """Guards the CI count (runs after the fuzz test in file order)."""
    if COUNT["modules"] == 0:
        pytest.skip("run together with test_fuzz_random_modules_match_eager")
    assert COUNT["modules"] >= MODULE_CASES - 10


def test_fuzz_covers_every_layer_kind():
    for kind in KINDS:
        check_module([(kind, ("gelu", "tanh"), 0.5, 1), ("linear", ("relu",), 0.1, 0)])


# --- 2. solver constraints -------------------------------------------------------------------------

@st.composite
def problems(draw):
    n = draw(st.integers(1, 9))
    inputs = tuple(
        tuple(sorted(draw(st.sets(st.integers(0, v - 1), max_size=3)))) if v else ()
        for v in range(n)
    )
    cost = tuple(draw(st.lists(st.integers(0, 64), min_size=n, max_size=n)))
    values = st.sets(st.integers(0, n - 1))
    needed = frozenset(draw(values))
    no_recompute = {v: "rule" for v in draw(values)} | {v: "graph input" for v in range(n) if not inputs[v]}
    if draw(st.booleans()):  # sometimes leave some inputless values recomputable (constants)
        for v in draw(values):
            if not inputs[v]:
                no_recompute.pop(v, None)
    no_save = {v: "rule" for v in draw(values)}
    return Problem(inputs, cost, needed, no_recompute, no_save)


@settings(max_examples=400, derandomize=True, deadline=None, database=None)
@given(problems())
def test_fuzz_solver_plan_or_conflict(p):
    best = brute_force(p)
    try:
        sol = solve(p)
    except ConflictError as e:
        assert best is None, f"conflict reported but a plan of cost {best} exists: {p}"
        assert e.chain and all(0 <= v < p.n for v, _ in e.chain)
        return
    assert best is not None
    assert not set(sol.saved) & set(p.no_save)
    assert recompute_closure(p, set(sol.saved)) is not None
    assert sol.cost == best == sum(p.cost[v] for v in sol.saved)


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x):
        # dropout is a random op remat replays when recomputed (Note [Replayed random ops]); the
        # uniform noise is one it does not, so policies forcing it to be recomputed must fail
        h = F.gelu(self.fc1(self.ln(x)))
        noisy = h * torch.rand_like(h)
        return x + self.fc2(F.dropout(h, 0.1, training=True) * torch.sigmoid(noisy))


@pytest.fixture(scope="module")
def joint_graph():
    """The joint graph AOTAutograd hands to a partitioner for ``Small``, with its arguments."""
    captured = {}

    def grab(joint, joint_inputs, **kwargs):
        captured.update(gm=copy.deepcopy(joint), inputs=joint_inputs, kwargs=kwargs)
        partition = make_partition_fn(Options(backend="eager"), lambda plan, frontier: None, EAGER, EAGER)
        return partition(joint, joint_inputs, **kwargs)

    from remat import compat
    from remat.backends.eager.backend import decompositions as eager_decompositions

    backend = compat.aot_autograd(fw_compiler=lambda gm, _: compat.make_boxed_func(gm.forward),
                                  bw_compiler=lambda gm, _: compat.make_boxed_func(gm.forward),
                                  partition_fn=grab, decompositions=eager_decompositions())
    torch._dynamo.reset()
    with compat.no_autograd_cache():
        torch.compile(Small(), backend=backend)(torch.randn(4, 8, requires_grad=True)).sum().backward()
    torch._dynamo.reset()
    return captured


OUTCOMES = collections.Counter()
OP_PATTERNS = ("aten.addmm", "aten.mm*", "aten.mul*", "aten.add*", "aten.erf", "aten.sub*", "aten.rsqrt",
               "aten.var_mean*", "aten.native_dropout", "getitem", "aten.view", "aten.permute",
               "aten.sigmoid", "prims.*", "*")
MODULE_PATTERNS = ("*", "fc1", "fc2", "ln", "f*", "nothing")
DECISIONS = (remat.MUST_SAVE, remat.MUST_RECOMPUTE, None)
CONDITIONS = {
    "any": lambda op: True, "getitem": lambda op: op.op == "getitem", "view": lambda op: op.is_view,
    "matmul": lambda op: op.is_matmul, "reduction": lambda op: op.reduction_ratio >= 4,
    "not reduction": lambda op: op.reduction_ratio < 4, "ln": lambda op: op.module == "ln",
    "forward": lambda op: op.forward, "backward-only": lambda op: not op.forward,
    "ln but its var_mean": lambda op: op.module == "ln" and not op.op.startswith("aten.var_mean"),
}


@st.composite
def policies(draw):
    rules = []
    for i in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(("save", "recompute", "callable")))
        if kind == "callable":  # a conjunction of conditions over OpInfo, then a decision
            conds = tuple(draw(st.lists(st.sampled_from(sorted(CONDITIONS)), min_size=1, max_size=2)))
            decision = draw(st.sampled_from(DECISIONS))
            safe = draw(st.booleans())  # leave random/side-effect/data-dependent ops alone

            def rule(op, conds=conds, decision=decision, safe=safe):
                if safe and op.unsafe_to_recompute:
                    return None
                return decision if all(CONDITIONS[c](op) for c in conds) else None

            rules.append(rule)
            continue
        ops = draw(st.lists(st.sampled_from(OP_PATTERNS), max_size=2))
        modules = draw(st.lists(st.sampled_from(MODULE_PATTERNS), max_size=1))
        if not ops and not modules:
            ops = ["*"]
        make = remat.save if kind == "save" else remat.recompute
        rules.append(make(ops=ops, modules=modules, name=f"r{i}"))
    return rules


@pytest.mark.xdist_group("fuzz-policies")
@settings(max_examples=300, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(policies())
def test_fuzz_random_policies_give_plan_or_remat_error(joint_graph, policy):
    plans = []
    partition = make_partition_fn(Options(backend="eager", policy=policy, strict=True),
                                  lambda plan, frontier: plans.append(plan), EAGER, EAGER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "rule matched no op"
        warnings.simplefilter("ignore", FutureWarning)  # deep-copying a graph module, torch 2.13
        gm = copy.deepcopy(joint_graph["gm"])
        try:
            fw, bw = partition(gm, joint_graph["inputs"], **joint_graph["kwargs"])
        except (remat.PolicyError, remat.PlanningError) as e:  # not strict mode's "planning failed"
            assert str(e).startswith("remat: ")
            OUTCOMES[type(e).__name__] += 1
            return
    OUTCOMES["plan"] += 1
    (plan,) = plans
    assert plan.fallback is None
    assert not [op for op in plan.recomputed_ops if op.startswith("aten.rand")]
    # a recomputed dropout runs only under the generator state its forward drew from
    bare = [n for n in bw.graph.nodes if n.op == "call_function" and str(n.target).startswith("aten.native_dropout")]
    assert not bare, bare
    assert fw.graph.find_nodes(op="output") and bw.graph.find_nodes(op="output")


@pytest.mark.xdist_group("fuzz-policies")
def test_fuzz_policies_reach_every_outcome():
    """Guards the policy fuzzer's reach (runs after it in file order)."""
    if not OUTCOMES:
        pytest.skip("run together with test_fuzz_random_policies_give_plan_or_remat_error")
    assert set(OUTCOMES) == {"plan", "PolicyError", "PlanningError"}, OUTCOMES
