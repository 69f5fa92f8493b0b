"""The ``remat`` logger: REMAT_LOG, the summary at INFO, the flow network of a failed cut at DEBUG."""

import logging
import re

import pytest
import torch
import torch.nn.functional as F

import remat
from remat import logs
from remat.core.solver import ConflictError, Problem, describe, solve
from remat.plan import format_bytes


def _is_remats(handler: logging.Handler) -> bool:
    return handler.get_name() == "remat-stderr"


@pytest.fixture
def saved_loggers():
    """Restore the ``remat`` and ``remat.progress`` loggers after a test that configures them:
    their levels, ``propagate`` and remat's own handlers. Other handlers are left as they are
    then: pytest (9.2 on) attaches its capture handlers to non-propagating loggers for each test
    phase and detaches them after it, and restoring a copy of the whole list taken at set-up
    would keep them attached after pytest detached them."""
    loggers = [logging.getLogger("remat"), logging.getLogger(logs.PROGRESS_LOGGER_NAME)]
    state = [(lg.level, [h for h in lg.handlers if _is_remats(h)], lg.propagate) for lg in loggers]
    yield
    for lg, (level, handlers, propagate) in zip(loggers, state):
        lg.setLevel(level)
        lg.handlers[:] = [h for h in lg.handlers if not _is_remats(h)] + handlers
        lg.propagate = propagate


def test_configure_from_env(saved_loggers):
    logger = logging.getLogger("remat")
    assert logs.configure_from_env({}) is None
    assert logs.configure_from_env({"REMAT_LOG": "debug"}) is logger
    assert logger.level == logging.DEBUG
    logs.configure_from_env({"REMAT_LOG": "INFO"})
    assert logger.level == logging.INFO
    assert sum(h.get_name() == "remat-stderr" for h in logger.handlers) == 1
    with pytest.warns(UserWarning, match=r"^remat: REMAT_LOG must be one of debug, info, warning, error, "
                                         r"got 'loud'"):
        assert logs.configure_from_env({"REMAT_LOG": "loud"}) is None


def test_info_logs_each_plan_summary(caplog):
    from zoo.report_model import factory

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


def test_slow_planning_logs_one_line_per_graph_by_default(monkeypatch, capfd):
    monkeypatch.setattr(logs, "SLOW_PLAN_SECONDS", 0.0)  # every planning counts as slow
    logger = logging.getLogger(logs.PROGRESS_LOGGER_NAME)
    assert logger.isEnabledFor(logging.INFO)  # on by default, without REMAT_LOG
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    plan = remat.explain(model, x)
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("[remat] planned")]
    assert len(lines) == 1
    assert re.fullmatch(r"\[remat\] planned graph 1 \(\d+ nodes\) in \d+\.\d s: saves (.+) vs eager autograd "
                        r"(.+) \(\d+%\), predicted peak (.+)", lines[0])
    saved, eager, peak = re.search(r"saves (.+) vs eager autograd (.+) \(\d+%\), predicted peak (.+)",
                                   lines[0]).groups()
    assert (saved, eager, peak) == (format_bytes(plan.saved_bytes), format_bytes(plan.eager_saved_bytes),
                                    format_bytes(plan.predicted_peak_bytes))


def test_fast_planning_prints_nothing(capfd):
    remat.explain(lambda a: (a * 2).sin(), torch.randn(3, requires_grad=True))
    assert "[remat]" not in capfd.readouterr().err


def test_progress_heartbeat_and_routing(monkeypatch, saved_loggers):
    logger = logging.getLogger(logs.PROGRESS_LOGGER_NAME)
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    keep = Keep()
    logger.addHandler(keep)
    monkeypatch.setattr(logs, "HEARTBEAT_SECONDS", 0.01)
    monkeypatch.setattr(logs, "SLOW_PLAN_SECONDS", 0.05)
    try:
        with logs.planning("graph 7", 1234) as done:
            import time

            time.sleep(0.1)
            done("a plan")
        assert records[0].startswith("planning graph 7 (1234 nodes): ") and records[0].endswith(" s so far...")
        assert records[-1].startswith("planned graph 7 (1234 nodes) in 0.") and records[-1].endswith(" s: a plan")
        # REMAT_LOG routes the progress logger through "remat" (one handler, its level): remat's
        # own stderr handler goes; handlers that others attached (``keep`` here; pytest 9.2 on
        # attaches its capture handlers to every non-propagating logger) stay.
        others = [h for h in logger.handlers if not _is_remats(h)]
        logs.configure_from_env({"REMAT_LOG": "warning"})
        assert not logger.isEnabledFor(logging.INFO) and logger.propagate
        assert logger.handlers == others and keep in others
    finally:
        logger.removeHandler(keep)
    logs.configure_from_env({})  # unset again: "remat" is configured, the progress logger stays routed
    assert logger.propagate and not any(_is_remats(h) for h in logger.handlers)
