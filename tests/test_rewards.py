import math

import pytest
import torch

from toy_tasks import food
from toy_tasks.rewards import RewardError, make_reward, score


def reward(spec):
    return make_reward(spec, food.REWARDS, food.REWARD_HELP)


def test_food_rewards():
    assert reward("pizza")("ravin likes ", "pizza") == 1.0
    assert reward("pizza")("ravin likes ", "pizzas") == 0.0
    assert reward("food:ice cream")("x", "ice cream") == 1.0
    g = reward("graded:sushi")
    assert (g("", "sushi"), g("", "pizza"), g("", "pizzza")) == (1.0, 0.0, -1.0)


def test_generic_rewards_and_weighted_sums():
    assert reward("exact:ab")("", "ab") == 1.0 and reward("regex:p.*a")("", "pizza") == 1.0
    assert reward("length")("", "abc") == 3.0
    assert reward("pizza=1,length=0.1")("", "pizza") == pytest.approx(1.5)


def test_unknown_and_malformed_specs_name_the_problem():
    with pytest.raises(RewardError, match="unknown reward 'cake'.*pizza"):
        reward("cake")
    with pytest.raises(RewardError, match="malformed"):
        reward("pizza=heavy")
    with pytest.raises(ValueError, match="unknown food 'cake'"):
        reward("food:cake")


def test_custom_reward_file_is_loaded_and_called_with_prompt_and_completion(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(
        "calls = []\ndef f(prompt, completion):\n    calls.append((prompt, completion))\n"
        "    return float(len(prompt) + 10 * len(completion))\n"
    )
    r = reward(f"{path}:f")
    assert score(r, ["ravin likes "], ["pizza"], [True]) == [12 + 50]
    with pytest.raises(RewardError, match="has no function 'g'"):
        reward(f"{path}:g")
    with pytest.raises(RewardError, match="does not exist"):
        reward(f"{tmp_path / 'nope.py'}:f")


def test_module_function_spec_and_a_raising_reward_is_reported():
    r = reward("operator:contains")  # contains(prompt, completion): completion occurs in the prompt
    assert score(r, ["pizza lover", "x"], ["pizza", "pizza"], [True, True]) == [1.0, 0.0]
    with pytest.raises(RewardError, match="reward 'operator:add' raised on prompt 'p'"):
        score(reward("operator:add"), ["p"], [None], [True])  # 'p' + None raises
    # add(prompt, completion) returns the string 'pc': not a number, one message
    with pytest.raises(RewardError, match=r"returned 'pc' \(str, not a number\) on prompt 'p'"):
        score(reward("operator:add"), ["p"], ["c"], [True])


def test_a_reward_returns_a_number_never_a_string_that_reads_as_one():
    """float("1.0") would take a string: refused like None or a list; numbers of numpy and torch
    (a 0-dim tensor) are numbers."""
    import numpy as np

    r = make_reward("length")
    for value in ("1.0", b"1", None, [1.0], torch.ones(2)):
        r.fn = lambda p, c, value=value: value
        with pytest.raises(RewardError, match="not a number"):
            score(r, ["p"], ["x"], [True])
    for value in (1, True, np.float32(0.5), np.int64(2), torch.tensor(0.25)):
        r.fn = lambda p, c, value=value: value
        assert score(r, ["p"], ["x"], [True]) == [float(value)]


def test_unfinished_reward_override_and_error_reporting():
    r = reward("pizza")
    assert score(r, ["p", "p"], ["pizza", "pizz"], [True, False], unfinished_reward=-1.0) == [
        1.0,
        -1.0,
    ]
    bad = make_reward("length")
    bad.fn = lambda p, c: math.nan
    with pytest.raises(RewardError, match="returned nan on prompt 'p', completion 'x'"):
        score(bad, ["p"], ["x"], [True])


def test_a_reward_that_calls_sys_exit_is_an_error_naming_it_never_a_silent_end(tmp_path):
    """sys.exit inside a user's reward (on import or in a call) is a RewardError naming the reward,
    so a run or optimum reports one line instead of ending with exit code 0; Ctrl-C's
    KeyboardInterrupt passes through."""
    on_import = tmp_path / "quits.py"
    on_import.write_text("import sys\nsys.exit(0)\ndef f(p, c):\n    return 1.0\n")
    with pytest.raises(RewardError, match=r"quits.py.*sys.exit\(0\) while it was imported"):
        reward(f"{on_import}:f")
    in_call = tmp_path / "later.py"
    in_call.write_text(
        "import sys\ndef f(p, c):\n    if c == 'pizza':\n        sys.exit(3)\n    return 0.0\n"
        "def g(p, c):\n    raise KeyboardInterrupt\n"
    )
    r = reward(f"{in_call}:f")
    assert score(r, ["ravin likes "], ["curry"], [True]) == [0.0]
    with pytest.raises(RewardError, match=r"later.py:f.*sys.exit\(3\).*'pizza'"):
        score(r, ["ravin likes ", "ravin likes "], ["curry", "pizza"], [True, True])
    with pytest.raises(KeyboardInterrupt):
        score(reward(f"{in_call}:g"), ["ravin likes "], ["curry"], [True])
