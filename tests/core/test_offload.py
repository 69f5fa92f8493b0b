"""Choosing and timing offloads of saved values to host memory (``remat.core.offload``).

Times are hand-computed on small timelines whose numbers are exact in binary; ``start[i]`` and
``end[i]`` are op ``i``'s start and end seconds.
"""

import pytest

from remat.core.offload import Link, OffloadCandidate, hidden, schedule

C = OffloadCandidate
UNIFORM = [1.0] * 10  # start[i] = i, end[i] = i + 1
B = 5  # ops 0-4 forward, 5-9 backward
LINK = Link(d2h=100.0, h2d=100.0)  # 100 bytes take 1 s


def test_one_value_exact_times_and_positions():
    # start: 0 1 3 4 4.5 5 6 8; end: 1 3 4 4.5 5 6 8 9; boundary 4
    seconds = [1.0, 2.0, 1.0, 0.5, 0.5, 1.0, 2.0, 1.0]
    # out: from end[0] = 1 for 300/200 = 1.5 s -> 1-2.5, ends during op 1 (end[1] = 3)
    # in: ends at start[6] = 6, 1.5 s -> 4.5-6; op 4 starts at 4.5: reloaded at op 4
    s = schedule([C(7, 300, 0, 6)], seconds, 4, Link(d2h=200.0, h2d=200.0))
    (e,) = s.entries
    assert (e.node, e.nbytes) == (7, 300)
    assert (e.out_start, e.out_end) == pytest.approx((1.0, 2.5))
    assert (e.in_start, e.in_end) == pytest.approx((4.5, 6.0))
    assert (e.freed_after, e.reloaded_at) == (1, 4)
    assert list(e.absent) == [2, 3]
    assert e.stall == 0 and s.stall_seconds == 0
    assert s.host_peak_bytes == 300 and s.nodes == (7,)
    assert "node 7: 300 B, out 1000.000-2500.000 ms, in 4500.000-6000.000 ms" in s.describe()


def test_copy_outs_are_fifo_and_copy_ins_serial():
    a, b = C(1, 250, 0, 9), C(2, 100, 1, 8)
    s = schedule([b, a], UNIFORM, B, LINK)  # given in any order
    assert s == schedule([a, b], UNIFORM, B, LINK)
    ea, eb = s.entries  # copy-out order
    # out a: end[0] = 1, 2.5 s -> 1-3.5, during op 3; b: issued at end[1] = 2, waits for a: 3.5-4.5, op 4
    assert (ea.out_start, ea.out_end, ea.freed_after) == pytest.approx((1.0, 3.5, 3))
    assert (eb.out_start, eb.out_end, eb.freed_after) == pytest.approx((3.5, 4.5, 4))
    # in a (latest needed first): ends at start[9] = 9, 2.5 s -> 6.5-9, op 6 starts at 6
    # in b: ends when a's starts (6.5 < start[8] = 8), 1 s -> 5.5-6.5, op 5
    assert (ea.in_start, ea.in_end, ea.reloaded_at) == pytest.approx((6.5, 9.0, 6))
    assert (eb.in_start, eb.in_end, eb.reloaded_at) == pytest.approx((5.5, 6.5, 5))
    assert s.stall_seconds == 0 and s.host_peak_bytes == 350
    assert list(ea.absent) == [4, 5] and not eb.absent


def test_copy_ins_needed_at_one_op_are_scheduled_backwards():
    seconds, boundary = [1.0] * 8, 4
    s = schedule([C(5, 200, 1, 6), C(3, 100, 0, 6)], seconds, boundary, LINK)
    e3, e5 = s.entries
    # out 3: 1-2 (op 1); out 5: issued at end[1] = 2, stream free: 2-4 (op 3)
    assert (e3.out_start, e3.out_end, e3.freed_after) == pytest.approx((1.0, 2.0, 1))
    assert (e5.out_start, e5.out_end, e5.freed_after) == pytest.approx((2.0, 4.0, 3))
    # H2D order 3 then 5 (tie on needed, by node): 5 ends at start[6] = 6 -> 4-6; 3 ends at 4 -> 3-4
    assert (e5.in_start, e5.in_end, e5.reloaded_at) == pytest.approx((4.0, 6.0, 4))
    assert (e3.in_start, e3.in_end, e3.reloaded_at) == pytest.approx((3.0, 4.0, 3))
    assert s.stall_seconds == 0


def test_schedule_reports_the_stall_of_a_forced_offload():
    # short window: out from end[4] = 5 to 6 (op 5); the copy-in would have to run 4-5, before the
    # copy-out ends, so it runs 6-7 and ends 2 s after start[5] = 5
    (e,) = schedule([C(3, 100, 4, 5)], UNIFORM, B, LINK).entries
    assert (e.out_start, e.out_end, e.freed_after) == pytest.approx((5.0, 6.0, 5))
    assert (e.in_start, e.in_end, e.reloaded_at) == pytest.approx((6.0, 7.0, 6))
    assert e.stall == pytest.approx(2.0)
    # slow H2D: in 300/50 = 6 s would start at 3, before the copy-out ends at 4: 4-10, 1 s late
    s = schedule([C(2, 300, 0, 9)], UNIFORM, B, Link(d2h=100.0, h2d=50.0))
    assert (s.entries[0].in_start, s.entries[0].in_end) == pytest.approx((4.0, 10.0))
    assert s.stall_seconds == pytest.approx(1.0)
    # two stalls add up: 1 s late each
    s = schedule([C(1, 100, 4, 5), C(2, 100, 4, 6)], UNIFORM, B, LINK)
    # out 1: 5-6, out 2: 6-7; in 1: 6-7 (needed start 5: 2 s late), in 2: 7-8 (start 6: 2 s late)
    assert [e.stall for e in s.entries] == pytest.approx([2.0, 2.0])
    assert s.stall_seconds == pytest.approx(4.0)


def test_a_copy_out_that_outlasts_the_step_is_never_freed():
    # out from 5 for 10 s ends at 15, after the step (end[9] = 10); the copy-in runs 15-25
    (e,) = schedule([C(0, 1000, 4, 9)], UNIFORM, B, LINK).entries
    assert e.freed_after == len(UNIFORM) and e.reloaded_at == 9 and not e.absent
    assert e.stall == pytest.approx(25.0 - 9.0)
    assert hidden([C(0, 1000, 4, 9)], UNIFORM, B, LINK).entries == ()


def test_hidden_prefers_the_larger_and_skips_what_stalls():
    big, small, short = C(2, 300, 0, 9), C(1, 200, 0, 9), C(3, 100, 4, 5)
    # each of big and small fits alone: big out 1-4 (op 3), in 6-9 (op 6): absent in ops 4, 5
    assert list(schedule([big], UNIFORM, B, LINK).entries[0].absent) == [4, 5]
    assert list(schedule([small], UNIFORM, B, LINK).entries[0].absent) == [3, 4, 5, 6]
    # together: small out 1-3, big 3-6 (op 5); big in 6-9 (op 6): big is never absent
    assert not schedule([big, small], UNIFORM, B, LINK).entries[1].absent
    # short stalls 2 s alone (test above); by bytes, big is kept, small and short are skipped
    s = hidden([small, short, big], UNIFORM, B, LINK)
    assert s.nodes == (2,) and s.stall_seconds == 0 and s.host_peak_bytes == 300
    assert s == schedule([big], UNIFORM, B, LINK)
    # a slow link makes big stall (1 s, test above): small is kept instead
    assert hidden([small, big], UNIFORM, B, Link(d2h=100.0, h2d=50.0)).nodes == (1,)
    assert hidden([short], UNIFORM, B, LINK).nodes == ()


def test_hidden_keeps_values_that_fit_together():
    # out 0: 1-2 (op 1); out 1: from end[1] = 2 to 3 (op 2). Both needed at op 9, H2D in node
    # order: 1 ends at start[9] = 9 -> 8-9 (op 8), 0 ends when 1 starts -> 7-8 (op 7)
    s = hidden([C(0, 100, 0, 9), C(1, 100, 1, 9)], UNIFORM, B, LINK)
    assert s.nodes == (0, 1) and s.host_peak_bytes == 200
    assert [(e.freed_after, e.reloaded_at) for e in s.entries] == [(1, 7), (2, 8)]
    assert [t for e in s.entries for t in (e.in_start, e.in_end)] == pytest.approx([7.0, 8.0, 8.0, 9.0])


def test_hidden_skips_a_value_that_would_never_be_absent():
    seconds = [1.0, 2.0, 1.0, 0.5, 0.5, 1.0, 2.0, 1.0]  # start: 0 1 3 4 4.5 5 6 8
    c = C(7, 300, 0, 6)
    # out 1-2.5 (op 1); a slower copy-in, 3 s, runs 3-6: issued at the start of op 2, no gap
    (e,) = schedule([c], seconds, 4, Link(d2h=200.0, h2d=100.0)).entries
    assert (e.freed_after, e.reloaded_at, e.stall) == (1, 2, 0)
    assert hidden([c], seconds, 4, Link(d2h=200.0, h2d=100.0)).entries == ()
    assert hidden([c], seconds, 4, Link(d2h=200.0, h2d=200.0)).nodes == (7,)  # absent in ops 2, 3
    assert hidden([C(8, 0, 0, 6)], seconds, 4, LINK).nodes == ()  # nothing to save


def test_nothing_to_offload():
    s = schedule([], UNIFORM, B, LINK)
    assert s.entries == () and s.nodes == () and s.stall_seconds == 0 and s.host_peak_bytes == 0
    assert s.describe() == "nothing offloaded"


@pytest.mark.parametrize("cands, seconds, boundary", [
    ([C(0, 100, 5, 6)], UNIFORM, B),  # ready at the boundary
    ([C(0, 100, 2, 4)], UNIFORM, B),  # needed in the forward
    ([C(0, 100, -1, 6)], UNIFORM, B),
    ([C(0, 100, 2, 10)], UNIFORM, B),  # needed past the last op
    ([C(0, -1, 2, 6)], UNIFORM, B),
    ([C(0, 100, 2, 6), C(0, 50, 3, 7)], UNIFORM, B),  # one node twice
    ([], UNIFORM, 0),
    ([], UNIFORM, 10),
    ([], [1.0, -1.0], 1),
    ([], [1.0, float("nan")], 1),
])
def test_invalid_input_raises(cands, seconds, boundary):
    with pytest.raises(ValueError, match="remat: "):
        schedule(cands, seconds, boundary, LINK)
    with pytest.raises(ValueError, match="remat: "):
        hidden(cands, seconds, boundary, LINK)


@pytest.mark.parametrize("d2h, h2d", [(0.0, 1.0), (1.0, -1.0), (float("nan"), 1.0)])
def test_bandwidth_must_be_positive(d2h, h2d):
    with pytest.raises(ValueError, match="bandwidth"):
        Link(d2h, h2d)


def test_hidden_leaves_values_the_host_takes_longer_to_issue_than_the_link_to_carry():
    # Note [Copies the host issues]: at 100 B/s, 200 bytes take 2 s and 100 bytes 1 s each way; with
    # 1.5 s of host time a value, only the 200-byte one is worth its copies
    big, small = C(0, 200, 0, 9), C(1, 100, 1, 9)
    assert hidden([big, small], UNIFORM, B, LINK).nodes == (0, 1)
    slow_host = Link(d2h=100.0, h2d=100.0, issue_seconds=1.5)
    assert slow_host.worth_a_copy(200) and not slow_host.worth_a_copy(100) and slow_host.worth_a_copy(150)
    assert hidden([big, small], UNIFORM, B, slow_host).nodes == (0,)
    assert schedule([big, small], UNIFORM, B, slow_host) == schedule([big, small], UNIFORM, B, LINK)  # device timing
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="issue_seconds must be finite and >= 0"):
            Link(d2h=1.0, h2d=1.0, issue_seconds=bad)
