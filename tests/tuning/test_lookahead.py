"""tuned_lookahead: tau by position from a pilot's loops, the choice of K on fake tables, and one real run on tiny
models whose acceptance is known (a draft that is the target itself, and one whose greedy token is never the target's)."""
import copy

import pytest
import torch

from specrepro.engines.lean import LeanRunner
from specrepro.tuning.lookahead import choose_lookahead, pilot, tau_by_lookahead, tuned_lookahead

from helpers import llama


def test_tau_counts_each_position_over_the_loops_that_reached_it():
    # four loops at K = 3: two kept everything, one kept 1, one kept 0; a fifth ran out of budget after 1 token
    accepted, proposed = [3, 3, 1, 0, 1], [3, 3, 3, 3, 1]
    out = tau_by_lookahead(accepted, proposed, 3)
    assert out["loops"] == {1: 5, 2: 4, 3: 4}
    assert out["p_reach"] == {1: 4 / 5, 2: 2 / 4, 3: 2 / 4}  # the short loop counts at position 1 only
    assert out["tau"] == pytest.approx({1: 1.8, 2: 2.3, 3: 2.8})
    # counting the short loop as a rejection at positions 2 and 3 would give 2/5: not what is measured
    assert out["p_reach"][2] != 2 / 5


def test_tau_stops_at_the_last_position_a_loop_reached():
    out = tau_by_lookahead([1, 2], [2, 2], 5)
    assert sorted(out["tau"]) == [1, 2]
    with pytest.raises(ValueError, match="accepted has 2 loops and proposed 1"):
        tau_by_lookahead([1, 2], [2], 3)


def test_choose_lookahead_minimises_expected_time_per_token():
    pass_ms = {1: 10.0, 2: 11.0, 3: 12.0, 4: 15.0, 5: 19.0}
    proposal_ms = {1: 1.0, 2: 1.3, 3: 1.6, 4: 1.9}
    tau = {1: 1.5, 2: 1.8, 3: 1.95, 4: 2.0}  # acceptance falling with the position
    out = choose_lookahead(pass_ms, proposal_ms, tau)
    brute = {k: (proposal_ms[k] + pass_ms[k + 1]) / tau[k] for k in tau}
    assert out["lookahead"] == min(brute, key=brute.get) == 2
    assert out["ms_per_token"][0] == 10.0
    assert out["expected_speedup"] == pytest.approx(10.0 / brute[2])
    # the i.i.d. model with a from the first position (a = 0.5) and K one-token steps would favour a longer
    # chain than the measured tau allows: the measured table, not that model, decides
    poor = {1: 1.1, 2: 1.12, 3: 1.13, 4: 1.13}
    lose = choose_lookahead(pass_ms, proposal_ms, poor)
    assert lose["lookahead"] == 1 and lose["expected_speedup"] < 1  # ArS is faster: said, not hidden


def test_choose_lookahead_refuses_tables_that_share_no_k():
    with pytest.raises(ValueError, match="one-token pass"):
        choose_lookahead({2: 1.0}, {1: 1.0}, {1: 1.5})
    with pytest.raises(ValueError, match="no K has a tau"):
        choose_lookahead({1: 10.0, 2: 11.0}, {3: 1.0}, {1: 1.5})


def test_pilot_and_tuned_lookahead_on_tiny_models():
    torch.manual_seed(0)
    target = llama(0, vocab=50)
    runner = LeanRunner(target, dtype=torch.float32)
    prompts = [torch.randint(0, 50, (6,)), torch.randint(0, 50, (5,))]
    # the target as its own draft: every drafted token is accepted (greedy)
    same = pilot(runner, LeanRunner(target, dtype=torch.float32), prompts, {"temperature": 0.0}, 3, 24)
    reach = tau_by_lookahead(same["accepted"], same["proposed"], 3)
    assert reach["p_reach"] == {1: 1.0, 2: 1.0, 3: 1.0}
    # the target with its head's rows rolled by one: its greedy token is never the target's
    other = copy.deepcopy(target)
    with torch.no_grad():
        other.lm_head.weight.copy_(target.lm_head.weight.roll(1, 0))
    out = tuned_lookahead(runner, LeanRunner(other, dtype=torch.float32), prompts,
                          {"greedy": {"temperature": 0.0}, "T=1": {"temperature": 1.0}}, max_lookahead=3, reps=3,
                          max_new_tokens=24)
    assert set(out) == {"greedy", "T=1"}
    assert out["greedy"]["p_reach"][1] == 0.0 and out["greedy"]["tau"][1] == 1.0
    assert out["greedy"]["expected_speedup"] < 1  # every K only adds work: reported, never hidden
    for choice in out.values():
        assert 1 <= choice["lookahead"] <= 3
        assert set(choice["pass_ms"]) >= {1, 2, 3, 4} and set(choice["proposal_ms"]) == {1, 2, 3}
        assert choice["ms_per_token"][choice["lookahead"]] == min(v for k, v in choice["ms_per_token"].items() if k)
    assert out["T=1"]["sampling"] == {"temperature": 1.0}


def test_tuned_lookahead_refuses_bad_arguments():
    target = llama(0, vocab=50)
    runner = LeanRunner(target, dtype=torch.float32)
    with pytest.raises(ValueError, match="at least one prompt"):
        tuned_lookahead(runner, runner, [], {"greedy": {"temperature": 0.0}})
    with pytest.raises(ValueError, match="max_lookahead"):
        tuned_lookahead(runner, runner, [torch.arange(4)], {"greedy": {"temperature": 0.0}}, max_lookahead=0)
    with pytest.raises(ValueError, match="samplings is empty"):
        tuned_lookahead(runner, runner, [torch.arange(4)], {})
