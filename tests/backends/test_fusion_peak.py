"""The Inductor materialisation model (``remat.backends.inductor.fusion``) and the peak it predicts.

Pure tests on hand-made schedules first (which values Inductor stores, how long the values an
inlined expression reads stay alive, in-place writes, kernel groups), then a few measurements:
the plan's predicted peak against the CPU profiler's peak of real Inductor-compiled steps.
"""

import copy
import dataclasses

import pytest
import torch

import remat
from remat.backends.inductor import fusion, lowering
from remat.backends.inductor.facts import Kind, NodeLowering
from remat.backends.inductor.kernel_model import KernelModel, at_readers
from remat.core.peak import Schedule, simulate
from zoo import workloads

from ..planning.test_budget import measured_peak

# --- hand-made graphs -------------------------------------------------------------------------


def graph(spec, outputs, dtype=None, heavy=(), rules=fusion.GPU, ops=None):
    """A forward-only schedule from ``[(name, kind, inputs, nbytes), ...]``; inputs by name.
    Kind ``input`` nodes are graph inputs (parameters: no bytes). ``ops``: each node's
    ``NodeLowering.ops`` (1 each by default)."""
    names = [s[0] for s in spec]
    ids = {n: i for i, n in enumerate(names)}
    facts = tuple(NodeLowering(Kind(s[1]), ops=ops[i] if ops else 1, dtype=(dtype or ["float32"] * len(spec))[i],
                               heavy=s[0] in heavy) for i, s in enumerate(spec))
    return Schedule(
        inputs=tuple(tuple(ids[u] for u in s[2]) for s in spec),
        nbytes=tuple(s[3] for s in spec),
        root=tuple(ids[s[2][0]] if s[1] == "view" else i for i, s in enumerate(spec)),
        graph_input=frozenset(i for i, s in enumerate(spec) if s[1] == "input"),
        tangent=frozenset(),
        backward=frozenset(),
        fwd_outputs=tuple(ids[n] for n in outputs),
        bwd_outputs=(),
        names=tuple(names),
        model=KernelModel(rules, facts),
    )


SIZED = dataclasses.replace(fusion.GPU, reuse_estimate_buffers=True)
"""The GPU's rules where Inductor's reuse estimate counts the graph's own buffers (its peak-memory
reordering on, or a pass that sizes them: Note [Reuse estimate])."""


def with_rules(s, rules):
    """``s`` simulated under other fusion rules."""
    return dataclasses.replace(s, model=KernelModel(rules, s.model.facts))


def fusion_graph(s, numel=()):
    """The forward of a hand-made schedule as ``fusion`` lowers it (no sizes by default: no
    broadcast seen)."""
    nodes = [v for v in range(s.n) if v not in s.graph_input]
    return s.model.graph(s, nodes, s.graph_input, s.fwd_outputs, numel)


def lowered(s, rules=None):
    return fusion.lower(fusion_graph(s), rules or s.model.rules)


def kernels(s, rules=None):
    return fusion.kernels(fusion_graph(s), lowered(s, rules), rules or s.model.rules)


def stored(s, rules=None):
    return {s.names[v] for v in lowered(s, rules).stored}


def test_a_kind_that_is_not_a_kind_is_an_internal_error():
    # No silent default: a lowering fact is a Kind, and every node of the schedule has one.
    with pytest.raises(remat.RematError, match="internal error"):
        NodeLowering("extern")
    s = graph([("x", "input", (), 0), ("a", "extern", ("x",), 100)], ["a"])
    short = dataclasses.replace(s, model=KernelModel(s.model.rules, s.model.facts[:1]))
    with pytest.raises(remat.RematError, match="internal error"):
        simulate(short, set())


def test_inlined_value_is_not_stored_and_extern_input_is():
    s = graph([("x", "input", (), 0), ("a", "extern", ("x",), 100), ("b", "pointwise", ("a",), 100),
               ("c", "pointwise", ("b",), 100), ("d", "extern", ("c",), 100)], ["d"])
    low = lowered(s)
    assert stored(s) == {"a", "c", "d"}
    assert low.reads[s.names.index("b")] == {s.names.index("a")}  # b is recomputed from a


def test_reduction_is_stored_its_pointwise_input_inlined():
    s = graph([("x", "input", (), 0), ("a", "extern", ("x",), 100), ("p", "pointwise", ("a",), 100),
               ("r", "reduction", ("p",), 4), ("o", "pointwise", ("r", "a"), 100)], ["o"])
    assert stored(s) == {"a", "r", "o"}


def test_view_of_inlined_value_read_by_extern_stores_the_base():
    s = graph([("x", "input", (), 0), ("a", "extern", ("x",), 100), ("p", "pointwise", ("a",), 100),
               ("v", "view", ("p",), 0), ("m", "extern", ("v",), 100)], ["m"])
    assert stored(s) == {"a", "p", "m"}


def test_reused_expensive_value_stored_on_cpu_only():
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 100), ("t", "pointwise", ("a",), 100),
            ("u1", "pointwise", ("t",), 100), ("u2", "pointwise", ("t",), 100), ("o", "pointwise", ("u1", "u2"), 100)]
    s = graph(spec, ["o"], heavy=["t"])
    assert "t" in stored(s, fusion.CPU)  # tanh/exp/... reused: the CPU backend stores it
    assert "t" not in stored(s, fusion.GPU)  # the GPU backend recomputes it in both readers


def test_broadcast_heavy_value_is_stored_on_cpu_and_its_reader_inlined():
    # The loss's log-softmax: z = x - log(sum(exp(x))) with log(...) one value per row, read by
    # the saved softmax exp(z) and by the gather of the target's entry (Note [Broadcast
    # realization]). Inductor's CPU backend stores the broadcast log (one per row), so z holds
    # no heavy op and both readers recompute it from x: no [rows, cols] buffer for z.
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 4000), ("r", "reduction", ("a",), 40),
            ("l", "pointwise", ("r",), 40), ("z", "pointwise", ("a", "l"), 4000),
            ("e", "pointwise", ("z",), 4000), ("g", "pointwise", ("z",), 40), ("s", "reduction", ("g",), 4)]
    s = graph(spec, ["e", "s"], heavy=["l", "e"])
    numel = tuple(n // 4 for n in s.nbytes)

    def stored_with(rules):
        return {s.names[v] for v in fusion.lower(fusion_graph(s, numel), rules).stored}

    assert stored_with(fusion.CPU) == {"a", "r", "l", "e", "s"}
    assert stored(s, fusion.CPU) == {"a", "r", "z", "e", "s"}  # without sizes: no broadcast seen
    assert stored_with(fusion.GPU) == {"a", "r", "e", "s"}  # GPU: neither is stored


def test_value_with_many_reads_and_several_readers_is_stored():
    def spec(n_reads):
        ins = [(f"i{k}", "extern", ("x",), 100) for k in range(n_reads)]
        return ([("x", "input", (), 0)] + ins
                + [("p", "pointwise", tuple(n for n, *_ in ins), 100),
                   ("u1", "pointwise", ("p",), 100), ("u2", "pointwise", ("p",), 100),
                   ("o", "pointwise", ("u1", "u2"), 100)])

    assert "p" not in stored(graph(spec(4), ["o"]))  # reads_threshold = 4
    assert "p" in stored(graph(spec(5), ["o"]))


def test_expression_reading_many_buffers_is_stored_past_the_device_threshold():
    ins = [(f"i{k}", "extern", ("x",), 100) for k in range(10)]
    chain, prev = [], None
    for k, (n, *_) in enumerate(ins):  # a chain folding one more buffer in at each step
        chain.append((f"p{k}", "pointwise", (n,) if prev is None else (prev, n), 100))
        prev = f"p{k}"
    s = graph([("x", "input", (), 0)] + ins + chain + [("o", "extern", (prev,), 100)], ["o"])
    assert "p7" not in stored(s, fusion.GPU) and "p8" in stored(s, fusion.GPU)  # 9 reads > 8 on GPU
    assert "p8" not in stored(s, fusion.CPU)  # at most 12 on CPU


def test_inlined_chain_extends_the_lifetime_of_what_it_reads():
    # a (400 B) feeds b (200 B, inlined under Inductor) which d reads after c: uncompiled, a dies
    # at b; under Inductor d recomputes b from a, so a lives until d.
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 400), ("b", "pointwise", ("a",), 200),
            ("c", "extern", ("x",), 100), ("d", "pointwise", ("b", "c"), 200)]
    s = graph(spec, ["d"])
    assert simulate(dataclasses.replace(s, model=None), set()).peak_bytes == 600  # a + b
    assert simulate(s, set()).peak_bytes == 700  # a + c + d


def test_low_precision_chain_keeps_its_float32_temporaries_on_chip():
    # bf16 -> fp32 -> fp32 -> bf16 between two matmuls: uncompiled, two fp32 tensors coexist.
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 100), ("b", "pointwise", ("a",), 200),
            ("c", "pointwise", ("b",), 200), ("d", "pointwise", ("c",), 100), ("e", "extern", ("d",), 100)]
    dt = ["bfloat16", "bfloat16", "float32", "float32", "bfloat16", "bfloat16"]
    s = graph(spec, ["e"], dtype=dt)
    assert simulate(dataclasses.replace(s, model=None), set()).peak_bytes == 400
    assert simulate(s, set()).peak_bytes == 200


def test_pointwise_kernel_writes_in_place_into_a_dying_buffer():
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 100), ("c", "extern", ("x",), 100),
            ("b", "pointwise", ("a", "c"), 100), ("e", "extern", ("b",), 100)]
    s = graph(spec, ["e"])
    ids = {n: i for i, n in enumerate(s.names)}
    _, alias = kernels(s)
    assert alias[ids["b"]] == ids["a"]  # written in place
    assert alias[ids["e"]] == ids["c"]  # the matmul's output reuses c, freed by the kernel before
    assert simulate(s, set()).peak_bytes == 200  # never three buffers at once
    plain = dataclasses.replace(s.model.rules, inplace=False, reuse=False)
    assert simulate(with_rules(s, plain), set()).peak_bytes == 300


def test_kernel_group_allocates_its_buffers_together():
    # Two reductions between the same two matmuls: one fused kernel allocates both before it
    # runs; unfused, the matmul's output is freed after the first reduction.
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 100), ("r", "reduction", ("a",), 100),
            ("q", "reduction", ("r",), 100), ("e", "extern", ("q",), 100)]
    s = graph(spec, ["e"])
    one_by_one = dataclasses.replace(fusion.GPU, kernel_groups=False, inplace=False, reuse=False)
    grouped = dataclasses.replace(fusion.CPU, inplace=False, reuse=False)
    assert simulate(with_rules(s, one_by_one), set()).peak_bytes == 200
    assert simulate(with_rules(s, grouped), set()).peak_bytes == 300


def test_cpu_local_buffer_is_not_stored():
    # p is read only row by row inside its own fused kernel: a per-row local buffer.
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 100), ("p", "pointwise", ("a",), 100),
            ("u1", "pointwise", ("p",), 100), ("u2", "pointwise", ("p",), 100),
            ("o", "pointwise", ("u1", "u2"), 100), ("e", "extern", ("o",), 100)]
    s = graph(spec, ["e"], heavy=["p"], rules=fusion.CPU)
    ks, _ = kernels(s)
    allocated = {s.names[v] for k in ks for v in k.allocs}
    assert "p" in stored(s) and "p" not in allocated


def test_work_of_another_size_is_another_triton_kernel():
    # HF GPT-2's padded LM head (H100, torch 2.11): the logits' gradient g (100 elements here) is
    # computed with a row sum s in one kernel, which reads the saved logits l for the last time;
    # its pad p (105 elements) loops over another iteration space, so Triton computes it in the
    # next kernel, after l is freed (Note [One iteration space]). The C++ backend loops over both
    # in one kernel: l, g, s and p at once.
    # Two matmuls read g (e, e2), so it is stored; l is a slice of the padded matmul's output
    # (420 bytes), so g is not written into it.
    spec = [("x", "input", (), 0), ("l", "extern", ("x",), 420), ("lv", "view", ("l",), 0),
            ("g", "pointwise", ("lv",), 400), ("s", "reduction", ("g",), 40), ("p", "pointwise", ("g",), 420),
            ("e", "extern", ("p",), 40), ("e2", "extern", ("g",), 40)]
    ops = (1, 1, 1, 40, 1, 1, 1, 1)
    s = graph(spec, ["e", "e2", "s"], ops=ops)
    ks, _ = kernels(s)
    assert [[s.names[v] for v in k.nodes] for k in ks] == [["l"], ["g", "s"], ["p"], ["e"], ["e2"]]
    assert simulate(s, set()).peak_bytes == 400 + 40 + 420 + 40  # at e: g, s, p and e (l freed after g)
    one_space = dataclasses.replace(fusion.GPU, one_iteration_space=False)
    assert simulate(with_rules(s, one_space), set()).peak_bytes == 420 + 400 + 40 + 420  # l, g, s, p
    c = graph(spec, ["e", "e2", "s"], ops=ops, rules=fusion.CPU)
    assert [[c.names[v] for v in k.nodes] for k in kernels(c)[0]] == [["l"], ["g", "s", "p"], ["e"], ["e2"]]


def test_a_reduction_kernel_takes_work_over_its_input_and_over_its_output():
    # r sums a's 10 rows of 10: one Triton kernel also computes z over a's 100 elements and y over
    # r's 10 (``can_fuse``: numel x rnumel, or numel); w, of 12 elements, is a kernel of its own,
    # and so is q, which reduces 100 elements in 20 rows of 5.
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 400), ("r", "reduction", ("a",), 40),
            ("z", "pointwise", ("a", "r"), 400), ("y", "pointwise", ("r",), 40), ("w", "pointwise", ("y",), 48),
            ("q", "reduction", ("z",), 80)]
    s = graph(spec, ["z", "y", "w", "q"])
    g = fusion_graph(s, None)  # with each value's elements: a reduction's operand sizes
    ks, _ = fusion.kernels(g, fusion.lower(g, fusion.GPU), fusion.GPU)
    assert [[s.names[v] for v in k.nodes] for k in ks] == [["a"], ["r", "z", "y"], ["w"], ["q"]]
    ks, _ = kernels(s)  # sizes unknown: the reductions fit any kernel
    assert [[s.names[v] for v in k.nodes] for k in ks] == [["a"], ["r", "z"], ["y"], ["w", "q"]]


def test_a_view_with_two_readers_stores_an_expensive_value_as_two_readers_would():
    # p (40 ops) has one reader, the view w, which two kernels read: Inductor marks p's storage
    # reused twice through the view and stores it (Note [Readers of a view]). With one reader of
    # the view, p is inlined into it.
    two = [("x", "input", (), 0), ("a", "extern", ("x",), 100), ("p", "pointwise", ("a",), 100),
           ("w", "view", ("p",), 0), ("u1", "pointwise", ("w",), 100), ("u2", "pointwise", ("w",), 100)]
    s = graph(two, ["u1", "u2"], ops=(1, 1, 40, 1, 1, 1))
    assert "p" in stored(s)
    one = two[:5]
    s = graph(one, ["u1"], ops=(1, 1, 40, 1, 1))
    assert "p" not in stored(s)


def test_a_pad_a_matmul_reads_stores_its_operand():
    # g (one reader, cheap) would be inlined into the pad p; Inductor stores the operand of a 2-D
    # pad whose one reader is a matmul first (Note [A padded matmul operand is stored]).
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 400), ("g", "pointwise", ("a",), 400),
            ("p", "pointwise", ("g",), 420), ("e", "extern", ("p",), 40)]
    s = graph(spec, ["e"])
    assert "g" not in stored(s)
    facts = list(s.model.facts)
    facts[3] = dataclasses.replace(facts[3], stores_operand=True)
    s = dataclasses.replace(s, model=KernelModel(s.model.rules, tuple(facts)))
    assert "g" in stored(s)


def test_a_random_value_is_computed_in_its_readers_kernel():
    # r (a dropout's random values) comes first in the graph, m (its mask) after the matmul b:
    # Inductor fuses r into m's kernel, where it is a local buffer (Note [Random values at their
    # readers]); the model had r allocated at the start, alive through b, then a, b, r at once.
    spec = [("x", "input", (), 0), ("r", "random", ("x",), 400), ("a", "extern", ("x",), 400),
            ("b", "extern", ("a",), 400), ("m", "pointwise", ("r", "b"), 400)]
    s = graph(spec, ["m"])
    ks, _ = kernels(s)
    assert [[s.names[v] for v in k.nodes] for k in ks] == [["a"], ["b"], ["m"]]
    assert simulate(s, set()).peak_bytes == 800  # a and b; then b and m
    first = dataclasses.replace(fusion.GPU, random_at_reader=False)
    assert simulate(with_rules(s, first), set()).peak_bytes == 1200
    saved = graph(spec, ["m", "r"])  # a random value the backward reads is stored where its reader runs
    ks, alias = kernels(saved)
    assert [[saved.names[v] for v in k.nodes] for k in ks] == [["a"], ["b"], ["r", "m"]]
    assert {saved.names[v]: saved.names[u] for v, u in alias.items()} == {"r": "a", "m": "b"}  # freed a, b
    assert simulate(saved, set()).peak_bytes == 800
    assert simulate(with_rules(saved, first), set()).peak_bytes == 1200


def test_what_a_local_buffer_reads_lives_until_its_kernel_runs():
    # p is a local buffer of the kernel computing o: that kernel reads a through p, so a stays
    # alive while it runs. (HF Llama's LM loss: the saved float32 softmax is read only through
    # the bf16 logits gradient, a Triton register value; GPU rules, 8 x 2048 tokens: predicted
    # 6862 MiB with the softmax freed at the backward's start, 8078 with it kept; read 8046.)
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 100), ("p", "pointwise", ("a",), 100),
            ("u1", "pointwise", ("p",), 100), ("u2", "pointwise", ("p",), 100),
            ("o", "pointwise", ("u1", "u2"), 100)]
    for rules in (fusion.CPU, fusion.GPU):
        s = graph(spec, ["o"], heavy=["p"], rules=rules, ops=(1, 1, 40, 1, 1, 1))
        ks, _ = kernels(s)
        assert [[s.names[v] for v in k.allocs] for k in ks] == [["a"], ["o"]]
        assert s.names.index("a") in ks[1].reads
        assert simulate(s, set()).peak_bytes == 200  # a and o together


def test_held_buffer_decision_counts_local_buffers_as_inductors_estimate_does():
    # d (100) may take a's freed buffer, held through c's kernel (a + b + c = 270 then), if
    # Inductor's estimate of the graph's peak allows it (where it sizes the graph's buffers).
    # That estimate counts p, which code generation later keeps in registers, and o beside d:
    # 300 at the last kernel, so a is held (Note [Reuse estimate]). Counting neither gave 190.
    # o is not written into d: its own code reads p, not d (``_inplace``).
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 100), ("b", "extern", ("a",), 80),
            ("c", "extern", ("b",), 90), ("d", "extern", ("c",), 100), ("p", "pointwise", ("d",), 100),
            ("u1", "pointwise", ("p",), 100), ("u2", "pointwise", ("p",), 100), ("o", "pointwise", ("u1", "u2"), 100)]
    s = graph(spec, ["o"], ops=(1, 1, 1, 1, 1, 40, 1, 1, 1), rules=SIZED)
    ks, alias = kernels(s)
    named = {s.names[k]: s.names[v] for k, v in alias.items()}
    assert named == {"d": "a"}  # d held a's buffer
    assert simulate(s, set()).peak_bytes == 270


def _row_kernel(cols, rules=fusion.GPU):
    # One fused kernel between two matmuls: p (40 ops, two readers: stored) and a row sum r of
    # a, then o1 and o2 from p and r. e reads a too, so nothing is written into a. Rows of
    # 8 x cols float32 elements.
    n = 8 * cols * 4
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), n), ("p", "pointwise", ("a",), n),
            ("r", "reduction", ("a",), 8 * 4), ("o1", "pointwise", ("p", "r"), n),
            ("o2", "pointwise", ("p", "r"), n), ("e", "extern", ("o1", "o2", "a"), n)]
    s = graph(spec, ["e"], rules=rules, ops=(1, 1, 40, 1, 1, 1, 1))
    ks, alias = kernels(s)
    return s, {s.names[v] for k in ks for v in k.allocs}, {s.names[k]: s.names[v] for k, v in alias.items()}


def test_looped_reduction_stores_what_a_later_pass_reads():
    # Rows of 1024 fit a persistent Triton kernel: p stays in registers. Rows of 2048 are
    # reduced in a loop: p, computed in the pass before the row sum and read in the pass after
    # it, is stored, and o2 (same size, p's last reader) is written into it in place.
    s, allocated, alias = _row_kernel(1024)
    assert "p" not in allocated and "o2" in allocated
    s, allocated, alias = _row_kernel(2048)
    assert "p" in allocated and alias.get("o2") == "p"
    n = s.nbytes[1]
    assert simulate(s, set()).peak_bytes == 4 * n  # a, o1, o2 (in p's buffer), then e
    no_inplace = dataclasses.replace(s.model.rules, inplace_in_kernel=False)
    no_inplace_s = with_rules(s, no_inplace)
    assert simulate(no_inplace_s, set()).peak_bytes == 4 * n + 32  # a, p, o1, o2, r
    _, allocated, _ = _row_kernel(2048, fusion.CPU)  # C++ keeps a whole row in a local buffer
    assert "p" not in allocated


def test_multi_output_extern_allocates_its_outputs_while_it_runs():
    # t (an attention backward) returns a tuple unpacked into g1 and g2 and holds 50 bytes of
    # scratch: its outputs exist while it runs, and its input a is freed only after it.
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 100), ("t", "extern", ("a",), 0),
            ("g1", "extern", ("t",), 100), ("g2", "extern", ("t",), 100), ("e", "extern", ("g1", "g2"), 100)]
    s = dataclasses.replace(graph(spec, ["e"]), workspace=(0, 0, 50, 0, 0, 0))
    assert simulate(s, set()).peak_bytes == 350  # a + g1 + g2 + scratch
    s = dataclasses.replace(s, model=None)
    assert simulate(s, set()).peak_bytes == 300  # uncompiled: a + g1 + g2 (no scratch modelled)


def test_output_that_views_an_extern_buffer_keeps_it():
    # A weight gradient is a transpose (a view) of a matmul's output: the matmul's buffer is a
    # graph output and no later buffer may reuse it.
    spec = [("x", "input", (), 0), ("m", "extern", ("x",), 100), ("v", "view", ("m",), 0),
            ("q", "extern", ("x",), 100), ("r", "extern", ("q",), 100)]
    s = graph(spec, ["v", "r"])
    assert simulate(s, set()).peak_bytes == 300


def _mix_order(rows, cols, sibling=True):
    # A layer norm backward's row sum r and weight gradient w (a sum over the batch) both read
    # the full gradient a. Without ``sibling`` w reads r's result (a plain split reduction).
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), rows * cols * 4),
            ("r", "reduction", ("a",), rows * 4),
            ("p", "pointwise", ("a",) if sibling else ("a", "r"), rows * cols * 4),
            ("w", "outer-reduction", ("p",), cols * 4), ("e", "extern", ("r", "w"), 4)]
    s = graph(spec, ["e"])
    ks, _ = kernels(s)
    return s, max(k.held for k in ks)


def test_mix_order_reduction_holds_a_float32_workspace():
    # 8192 rows on 132 SMs: splits of 16 rows; one batch reduction of 1024 columns.
    s, held = _mix_order(8192, 1024)
    assert held == 4 * 1024 * (8192 // 16)
    assert simulate(s, set()).peak_bytes >= s.nbytes[1] + held
    assert _mix_order(8192, 1024, sibling=False)[1] == 0  # w depends on r: no mix-order kernel
    assert _mix_order(2048, 1024)[1] == 0  # fewer than twice as many rows as columns
    assert _mix_order(65536, 1024)[1] == 4 * 1024 * (65536 // 32)  # 65536 // (8 * 132) -> 32


def test_eager_and_inductor_schedules_of_a_workload():
    model, x = workloads.build("mlp", "small")
    plan_inductor = remat.explain(remat.checkpoint(copy.deepcopy(model)), x)
    torch._dynamo.reset()
    plan_eager = remat.explain(remat.checkpoint(copy.deepcopy(model), backend="eager"), x)
    # The same values (the uncompiled backend keeps GELU whole, Note [Eager GELU]: node names differ).
    def what(plan):
        return [(t.module, t.op, t.shape, t.nbytes, t.reason) for t in plan.saved]

    assert what(plan_inductor) == what(plan_eager)
    # eager_peak_bytes is eager autograd's uncompiled peak whatever the backend (decomposed ops
    # are grouped back into their eager kernels, Note [Eager kernels]).
    assert plan_inductor.eager_peak_bytes == plan_eager.eager_peak_bytes


# --- against measured peaks (Inductor, CPU; measured as in test_budget) -----------------------

@pytest.mark.inductor
@pytest.mark.slow
@pytest.mark.parametrize("name, size, budget", [
    ("pointwise", "small", None),  # one C++ kernel holds every layer's backward buffers
    ("mlp", "medium", 1.0),
    ("gpt", "small", None),
])
def test_predicted_peak_matches_measured_under_inductor(name, size, budget):
    model, x = workloads.build(name, size)
    rm = remat.checkpoint(copy.deepcopy(model), backend="inductor", budget=budget)
    measured = measured_peak(rm, x)
    (plan,) = remat.compiled_plans(rm)
    assert abs(plan.predicted_peak_bytes - measured) <= 0.05 * measured, (plan.predicted_peak_bytes, measured)


def test_cpu_flash_attention_scratch_matches_the_kernel():
    # The per-thread blocks ATen's CPU flash attention allocates inside the op (and frees before
    # it returns), read from the profiler, equal what the model charges for it.
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    from remat.backends.aten_scratch import cpu_flash_attention_scratch

    q, k, v = (torch.randn(2, 4, 256, 16, requires_grad=True) for _ in range(3))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True)
        gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            torch.ones_like(out[0]), q, k, v, out[0], out[1], 0.0, True)
    base = prof.profiler.kineto_results.trace_start_ns()
    timeline = sorted(prof._memory_profile().timeline, key=lambda e: e[0])
    outputs = {False: sum(t.untyped_storage().nbytes() for t in out), True: 3 * q.untyped_storage().nbytes()}
    scratch = {}
    for e in prof.events():
        if e.name.startswith("aten::_scaled_dot_product_flash_attention_for_cpu"):
            lo, hi = base + e.time_range.start * 1000, base + e.time_range.end * 1000
            live = most = 0
            for t, action, _, size in timeline:
                if lo <= t <= hi and action in (Action.CREATE, Action.DESTROY):
                    live += size if action == Action.CREATE else -size
                    most = max(most, live)
            backward = e.name.endswith("_backward")
            scratch[backward] = most - outputs[backward]  # held beyond the op's outputs

    def node(backward):
        graph = torch.fx.Graph()
        args = [graph.placeholder(n) for n in ("g", "q", "k", "v")[0 if backward else 1:]]
        for a, t in zip(args, ([out[0]] if backward else []) + [q, k, v]):
            a.meta["val"] = t
        return graph.call_function(torch.ops.aten.add.Tensor, tuple(args))  # only args are read

    assert scratch[False] == cpu_flash_attention_scratch(node(False), backward=False) > 0
    # The backward's per-thread row sums (256 B each) are allocated on worker threads, which the
    # profiler does not always see.
    model = cpu_flash_attention_scratch(node(True), backward=True)
    assert 0 <= model - scratch[True] <= 256 * torch.get_num_threads() and scratch[True] > 0


def test_reuse_within_the_margin_of_inductors_estimate_holds_the_buffer():
    # c (1000 B) may take a's buffer, freed two kernels earlier, if holding it meanwhile keeps
    # Inductor's peak estimate: holding it needs 2012 B against an estimated peak of 2004 B.
    # Inductor's own estimate differs from the model's by small buffers, so the model allows
    # a rise of up to ``reuse_margin`` (1%): a stays allocated, and the peak is 2012 B.
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 1000), ("b", "extern", ("a",), 1000),
            ("q", "extern", ("x",), 8), ("p", "extern", ("q",), 4), ("c", "extern", ("b", "p"), 1000)]
    s = graph(spec, ["c"], rules=SIZED)
    assert simulate(s, set()).peak_bytes == 2012
    exact = dataclasses.replace(s.model.rules, reuse_margin=0.0)
    assert simulate(with_rules(s, exact), set()).peak_bytes == 2004


def test_output_written_in_place_keeps_its_buffer_in_inductors_estimate():
    # The output v is written into s's buffer, which therefore lives to the end of the graph in
    # Inductor's peak estimate. Its peak is 364 B (e and f, at the start); c could take a's
    # buffer, freed three kernels earlier, only if holding it meanwhile (100 B on top of 358 B
    # while m and n run) stayed within it: it does not, so c gets its own buffer. Counting s's
    # buffer as freed at v would lower the middle to 258 B and allow the reuse.
    spec = [("x", "input", (), 0), ("e", "extern", ("x",), 360), ("f", "extern", ("e",), 4),
            ("s", "extern", ("x",), 100), ("v", "pointwise", ("s",), 100), ("a", "extern", ("x",), 100),
            ("b", "extern", ("a",), 100), ("m", "extern", ("x",), 150), ("n", "extern", ("m",), 4),
            ("c", "extern", ("b",), 100)]
    s = graph(spec, ["f", "v", "n", "c"], rules=SIZED)
    _, alias = kernels(s, dataclasses.replace(s.model.rules, reuse_margin=0.0))
    assert {s.names[k]: s.names[v] for k, v in alias.items()} == {"v": "s"}


@pytest.mark.inductor
@pytest.mark.slow
def test_simulated_peak_of_an_hf_llama_lm_loss_matches_inductors_plan():
    # A real vocabulary (32000) makes the LM loss's float32 [tokens, vocab] values dominate the
    # peak. Inductor's CPU backend stores the broadcast log(sum(exp)) per row and inlines the
    # log-softmax into its readers (Note [Broadcast realization]); simulated without that rule:
    # +24% against the peak read from the generated wrapper (512 tokens).
    import transformers
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=1, vocab_size=32000,
                                   attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).train()
    ids = torch.randint(0, 32000, (1, 256), generator=torch.Generator().manual_seed(1))
    rm = remat.checkpoint(model)
    rm(input_ids=ids, labels=ids).loss.backward()
    (plan,) = remat.compiled_plans(rm)
    assert plan.compiled_peak_bytes
    assert abs(plan.simulated_peak_bytes - plan.compiled_peak_bytes) <= 0.03 * plan.compiled_peak_bytes, (
        plan.simulated_peak_bytes, plan.compiled_peak_bytes)


# --- kernels Inductor fuses or moves across the graph's order -----------------------------------


def test_sibling_kernels_sharing_a_read_are_fused_where_the_first_runs():
    # p1 and p2 both read a and loop over as many elements; nothing between them feeds p2, so
    # Inductor fuses them into one kernel where p1 runs (Note [Sibling kernels fused]): both pads
    # of GPT-2's logits gradient were written at once. Without the rule they never coexist.
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 100), ("p1", "pointwise", ("a",), 200),
            ("m1", "extern", ("p1",), 10), ("q", "extern", ("m1",), 10), ("p2", "pointwise", ("a",), 200),
            ("m2", "extern", ("p2", "q"), 10)]
    s = graph(spec, ["m2"])
    ks, _ = kernels(s)
    assert [[s.names[v] for v in k.nodes] for k in ks][:2] == [["a"], ["p1", "p2"]]
    assert simulate(s, set()).peak_bytes == 500  # a, p1 and p2 at once
    apart = dataclasses.replace(fusion.GPU, horizontal_fusion=False)
    assert simulate(with_rules(s, apart), set()).peak_bytes == 310  # a, p1 and m1 at most


def test_a_sibling_that_reads_a_later_value_is_not_fused():
    # p2 reads q, which runs after p1's kernel: fusing them would be a cycle, so p2 stays.
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 100), ("p1", "pointwise", ("a",), 200),
            ("m1", "extern", ("p1",), 10), ("q", "extern", ("m1",), 200), ("p2", "pointwise", ("a", "q"), 200),
            ("m2", "extern", ("p2",), 10)]
    s = graph(spec, ["m2"])
    ks, _ = kernels(s)
    assert ["p1"] in [[s.names[v] for v in k.nodes] for k in ks]


def _with_at_reader(s, name):
    facts = list(s.model.facts)
    v = s.names.index(name)
    facts[v] = dataclasses.replace(facts[v], at_reader=True)
    return dataclasses.replace(s, model=KernelModel(s.model.rules, tuple(facts)))


def test_a_matmul_fused_into_the_add_reading_it_runs_at_the_add():
    # m is a matmul whose one reader is the add s (Inductor's addmm, Note [Matmuls fused into the
    # add that reads them]): computed there, it is not alive while b1 and b2 run.
    spec = [("x", "input", (), 0), ("m", "extern", ("x",), 100), ("b1", "extern", ("x",), 100),
            ("b2", "extern", ("b1",), 100), ("s", "pointwise", ("b2", "m"), 100)]
    s = graph(spec, ["s"])
    assert simulate(s, set()).peak_bytes == 300  # m, b1 and b2
    moved = _with_at_reader(s, "m")
    assert [moved.names[v] for v in at_readers(moved, list(range(1, 5)), moved.model.facts)] == ["b1", "b2", "m", "s"]
    assert simulate(moved, set()).peak_bytes == 200  # b2 and m, then s written into one of them


def test_addmm_fusion_is_read_off_the_graph_for_full_adds_only():
    def f(a, b, c, bias):
        return (c + a @ b).sum() + (bias + a @ b).sum()

    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(f)(torch.randn(4, 3), torch.randn(3, 5), torch.randn(4, 5), torch.randn(5))
    mms = [n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default]
    assert [lowering.node_lowering(n, None).at_reader for n in mms] == [True, False]  # a bias is not full


def test_a_buffer_two_nodes_of_a_kernel_read_is_not_written_in_place():
    # p and q (one kernel between the matmuls a and e) both read a for the last time. Inductor
    # writes a node into an input only where it is that input's one use left, so neither takes
    # a's buffer (ViT's recomputed GELU input, read by the GELU and its derivative); e, an extern
    # kernel after them, may reuse it once it is freed.
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 100), ("p", "pointwise", ("a",), 100),
            ("q", "pointwise", ("a",), 100), ("e", "extern", ("p", "q"), 100)]
    s = graph(spec, ["e"])
    ks, alias = kernels(s)
    assert {s.names[k]: s.names[v] for k, v in alias.items()} == {"e": "a"}
    assert [[s.names[v] for v in k.allocs] for k in ks] == [["a"], ["p", "q"], []]
    assert simulate(s, set()).peak_bytes == 300


def test_no_write_into_the_input_of_a_local_buffer():
    # o's own code reads the local buffer p (40 ops, two readers: stored, kept in registers), not
    # d, which p's node reads: o gets its own buffer (HF Llama's logits gradient, computed from a
    # float32 local buffer, beside the recomputed logits).
    spec = [("x", "input", (), 0), ("d", "extern", ("x",), 100), ("p", "pointwise", ("d",), 100),
            ("u1", "pointwise", ("p",), 100), ("u2", "pointwise", ("p",), 100), ("o", "pointwise", ("u1", "u2"), 100),
            ("e", "extern", ("o",), 100)]
    s = graph(spec, ["e"], ops=(1, 1, 40, 1, 1, 1, 1))
    ks, alias = kernels(s)
    assert "o" not in {s.names[k] for k in alias}
    assert "o" in {s.names[v] for k in ks for v in k.allocs}


def test_reuse_estimate_without_the_graphs_own_buffers():
    # remat's order kept, Inductor's estimate sizes no buffer of the graph (Note [Reuse estimate]):
    # a forward's estimate is 0, so c takes a's buffer only if it were the next kernel; it is
    # two kernels later and gets its own (2004 B). Where the estimate counts every buffer (SIZED)
    # holding a is within the margin (2012 B).
    spec = [("x", "input", (), 0), ("a", "extern", ("x",), 1000), ("b", "extern", ("a",), 1000),
            ("q", "extern", ("x",), 8), ("p", "extern", ("q",), 4), ("c", "extern", ("b", "p"), 1000)]
    assert simulate(graph(spec, ["c"]), set()).peak_bytes == 2004
    assert simulate(graph(spec, ["c"], rules=SIZED), set()).peak_bytes == 2012


def test_which_settings_make_inductor_size_its_buffers():
    # Note [Reuse estimate]: with the peak-memory reordering off, a graph's buffers are sized for
    # the estimate only under these settings; remat's rules follow them (backend.rules_for_graph).
    from torch._inductor import config

    from remat.backends.inductor.backend import rules_for_graph
    from remat.backends.inductor.hooks import estimate_sizes_buffers

    overlap = getattr(config, "aten_distributed_optimizations", None)
    off = {"combo_kernels": False, "reorder_for_compute_comm_overlap": False}
    if overlap is not None and hasattr(overlap, "enable_simple_overlap"):
        off["aten_distributed_optimizations.enable_simple_overlap"] = False
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    with config.patch(off):
        assert not estimate_sizes_buffers() and not rules_for_graph(gm).reuse_estimate_buffers
    with config.patch({**off, "combo_kernels": True}):
        assert estimate_sizes_buffers() and rules_for_graph(gm).reuse_estimate_buffers
