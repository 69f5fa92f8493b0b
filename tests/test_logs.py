"""The ``remat`` logger: REMAT_LOG, the summary at INFO, the flow network of a failed cut at DEBUG."""

import logging

import pytest
import torch
import torch.nn.functional as F

import remat
from remat import logs
from remat.solver import ConflictError, Problem, describe, solve


def test_configure_from_env():
    logger = logging.getLogger("remat")
    level, handlers = logger.level, list(logger.handlers)
    try:
        assert logs.configure_from_env({}) is None
        assert logs.configure_from_env({"REMAT_LOG": "debug"}) is logger
        assert logger.level == logging.DEBUG
        logs.configure_from_env({"REMAT_LOG": "INFO"})
        assert logger.level == logging.INFO
        assert sum(h.get_name() == "remat-stderr" for h in logger.handlers) == 1
        with pytest.warns(UserWarning, match=r"^remat: REMAT_LOG must be one of debug, info, warning, error, "
                                             r"got 'loud'"):
            assert logs.configure_from_env({"REMAT_LOG": "loud"}) is None
    finally:
        logger.setLevel(level)
        logger.handlers[:] = handlers


def test_info_logs_each_plan_summary(caplog):
    from .report_model import factory

    model, args = factory()
    with caplog.at_level(logging.INFO, logger="remat"):
        plan = remat.explain(model, *args)
    messages = [r.getMessage() for r in caplog.records if r.name == "remat" and r.levelno == logging.INFO]
    assert messages == [plan.summary()]


def test_debug_dumps_the_flow_network_of_a_failed_cut(caplog):
    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    q, k, v = (torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(3))
    wrapped = remat.checkpoint(attention, backend="eager", policy=[remat.recompute(ops="getitem")])
    with caplog.at_level(logging.DEBUG, logger="remat"), pytest.raises(remat.PlanningError):
        remat.explain(wrapped, q, k, v)
    dumps = [r.getMessage() for r in caplog.records if r.name == "remat" and "flow network" in r.getMessage()]
    assert len(dumps) == 1
    assert "cannot be recomputed: attention" in dumps[0]
    assert "cannot be saved: user rule `must_recompute(getitem)`" in dumps[0]
    assert "conflict (every edge on this path is infinite):" in dumps[0]


def test_describe_lists_every_edge():
    p = Problem(inputs=((), (0,), (1,)), cost=(16, 8, 4), needed=frozenset({2}),
                no_recompute={0: "graph input"}, no_save={1: "view"}, names=("x", "v", "y"))
    assert describe(p) == "\n".join([
        "flow network: 3 values, 1 read by the backward; vertices <name>.in and <name>.out per value, plus "
        "source and sink",
        "  source -> x.in  inf  cannot be recomputed: graph input",
        "  x.in -> x.out  16  bytes if saved",
        "  v.in -> v.out  inf  cannot be saved: view",
        "  x.out -> v.in  inf  data",
        "  y.in -> y.out  4  bytes if saved",
        "  v.out -> y.in  inf  data",
        "  y.out -> sink  inf  the backward reads it",
    ])
    bad = Problem(inputs=((), (0,)), cost=(16, 8), needed=frozenset({1}), no_recompute={0: "random op"},
                  no_save={0: "multi-output op", 1: "user rule `r`"}, names=("a", "b"))
    with pytest.raises(ConflictError) as e:
        solve(bad)
    text = describe(bad, e.value.chain)
    assert text.endswith("conflict (every edge on this path is infinite):\n"
                         "  a: cannot be recomputed (random op) and cannot be saved (multi-output op)\n"
                         "  b: cannot be saved (user rule `r`); the backward needs it")
