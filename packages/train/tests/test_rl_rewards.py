"""The reward functions of ``rl.rewards``: ``math`` against TRL's ``accuracy_reward`` on a table of cases,
``exact``, ``format``, user functions by module path, weighted sets, and the errors each names."""

from __future__ import annotations

import math
import pickle
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from halyard.train.config.errors import ConfigError
from halyard.train.rl.rewards.exact import exact_reward
from halyard.train.rl.rewards.math_answer import math_reward
from halyard.train.rl.rewards.overlong import overlong_penalty
from halyard.train.rl.rewards.registry import load_reward
from halyard.train.rl.rewards.scoring import RewardError, load_rewards
from halyard.train.user_errors import exit_code_of

NAN = math.nan

# (completion, reference answer, reward); NaN: the reference does not parse, the example is not scored.
MATH_CASES = [
    (r"The answer is \boxed{\frac{1}{3}}", r"\frac{1}{3}", 1.0),
    (r"The answer is \boxed{\frac{1}{2}}", r"\frac{1}{3}", 0.0),
    (r"So we get $\boxed{0.5}$.", r"\frac{1}{2}", 1.0),
    (r"\boxed{\dfrac{2}{4}}", r"$\frac12$", 1.0),
    (r"\boxed{-\frac{3}{4}}", "-0.75", 1.0),
    (r"Natalia sold 48 + 24 = 72 clips. \boxed{72}", "72", 1.0),
    (r"\boxed{73}", "72", 0.0),
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{x^2 + 2x}", r"$2x + x^2$", 1.0),
    (r"\boxed{\sqrt{2}}", r"$\sqrt{2}$", 1.0),
    (r"\boxed{\sqrt{3}}", r"$\sqrt{2}$", 0.0),
    (r"\boxed{\pi}", r"$\pi$", 1.0),
    (r"\boxed{(1, 2]}", r"$(1,2]$", 1.0),
    (r"\boxed{5\text{ cm}}", "5", 1.0),
    (r"\boxed{50\%}", r"50\%", 1.0),
    (r"First $\boxed{3}$, then \boxed{4}", "4", 0.0),  # the first answer counts
    ("The answer is 72", "72", 0.0),  # no LaTeX and no box: nothing is taken from plain text
    (r"$x = 3$", "3", 0.0),
    (r"\boxed{\frac{1}{0}", r"\frac{1}{3}", 0.0),  # malformed
    ("", "72", 0.0),
    (r"\boxed{72}", "not an answer", NAN),
    (r"\boxed{72}", "", NAN),
    (r"\boxed{\sqrt{2}}", r"\sqrt{2}", NAN),  # LaTeX without $...$ is not parsed as the reference
]


def test_math_equals_trl_accuracy_reward() -> None:
    trl_rewards = pytest.importorskip("trl.rewards")
    completions = [[{"role": "assistant", "content": completion}] for completion, _, _ in MATH_CASES]
    expected = trl_rewards.accuracy_reward(completions, [answer for _, answer, _ in MATH_CASES])
    ours = [math_reward("What is it?", completion, answer) for completion, answer, _ in MATH_CASES]
    as_trl = [None if math.isnan(value) else value for value in ours]
    assert as_trl == expected
    np.testing.assert_array_equal(ours, [reward for _, _, reward in MATH_CASES])


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        ("72", "72", 1.0),
        ("  72\n", " 72 ", 1.0),
        ("Paris", "Paris", 1.0),
        ("paris", "Paris", 0.0),  # text is compared as it is
        ("72.0", "72", 1.0),
        ("+72", "72", 1.0),
        ("1,000", "1000", 1.0),
        ("0.5", "1/2", 1.0),
        (".5", "0.50", 1.0),
        ("1e3", "1000", 1.0),
        ("-3", "3", 0.0),
        ("72.01", "72", 0.0),
        ("The answer is 72", "72", 0.0),  # the whole completion is the answer
        ("1,00", "100", 0.0),  # not thousands grouping
        ("1/0", "1/0", 1.0),  # the same text, though not a number
        ("2/0", "1/0", 0.0),
        ("", "72", 0.0),
    ],
)
def test_exact(completion: str, answer: str, reward: float) -> None:
    assert exact_reward("prompt", completion, answer) == reward
    assert load_reward("exact").function("prompt", completion, answer) == reward


def test_format_matches_the_whole_stripped_completion() -> None:
    reward = load_reward(r"format:<think>.*</think>\s*<answer>\d+</answer>")
    assert reward.name == "format"
    assert reward.function("p", "<think>one\ntwo</think>\n<answer>72</answer>\n", "72") == 1.0
    assert reward.function("p", "<think>x</think><answer>72</answer> and more", "72") == 0.0
    assert reward.function("p", "so <think>x</think><answer>72</answer>", "72") == 0.0
    assert reward.function("p", "<think>x</think><answer>seventy</answer>", "72") == 0.0
    bare = load_reward("format", format_pattern="[0-9]+")
    assert bare.function("p", " 72 ", "") == 1.0 and bare.function("p", "7 2", "") == 0.0
    copy = pickle.loads(pickle.dumps(reward.function))  # rewards may be scored in other processes
    assert copy("p", "<think></think><answer>1</answer>", "") == 1.0


def test_format_errors() -> None:
    with pytest.raises(ConfigError, match=r"format:REGEX"):
        load_reward("format")
    with pytest.raises(ConfigError, match=r"format:\(unclosed is not a regular expression \(missing \)"):
        load_reward("format:(unclosed")


def write_module(folder: Path, name: str, source: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def rewards_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The current folder (not on sys.path); sys.path restored and the modules imported from it forgotten."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", str(tmp_path))])
    yield tmp_path
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def test_user_function_from_the_current_folder(rewards_folder: Path) -> None:
    write_module(
        rewards_folder,
        "my_rewards",
        """
        def length_bonus(prompt, completion, answer):
            return len(completion) / 10

        LIMIT = 3

        def two_arguments(prompt, completion):
            return 0.0

        def _hidden(prompt, completion, answer):
            return 0.0
        """,
    )
    reward = load_reward("my_rewards:length_bonus")
    assert reward.name == "length_bonus" and reward.spec == "my_rewards:length_bonus"
    assert reward.function("p", "12345", "a") == 0.5
    errors = {
        "my_rewards:length_bonu": r"^rl.rewards: my_rewards:length_bonu: module my_rewards \(.*my_rewards.py\) "
        r"has no length_bonu. Did you mean 'length_bonus'\?$",
        "my_rewards:LIMIT": r"^rl.rewards: my_rewards:LIMIT is a int, not a function of \(prompt, completion, "
        r"answer\)$",
        "my_rewards:two_arguments": r"takes \(prompt, completion\), but a reward is called with three",
        "no_such_module:reward": r"^rl.rewards: no_such_module:reward: no module no_such_module on the Python "
        r"path or in .* \(run from the folder that holds it, or add that folder to PYTHONPATH\)$",
        "my_rewards.sub:reward": "no module my_rewards.sub",
        "lenght": "unknown reward 'lenght'",
        "mth": "Did you mean 'math'",
        ":reward": "is not module.path:function",
    }
    for spec, message in errors.items():
        with pytest.raises(ConfigError, match=message) as error:
            load_reward(spec)
        assert "\n" not in str(error.value)


def test_user_module_that_fails_to_import(rewards_folder: Path) -> None:
    write_module(rewards_folder, "needs_missing", "import not_installed_anywhere\n")
    write_module(rewards_folder, "raises_on_import", "raise RuntimeError('no API key\\nset KEY')\n")
    with pytest.raises(
        ConfigError, match="importing needs_missing failed: No module named 'not_installed_anywhere'"
    ):
        load_reward("needs_missing:reward")
    with pytest.raises(ConfigError, match="raised RuntimeError: no API key; set KEY$"):
        load_reward("raises_on_import:reward")


def test_weighted_set_scores_each_function_and_the_sum(rewards_folder: Path) -> None:
    write_module(
        rewards_folder,
        "partial",
        """
        def only_short(prompt, completion, answer):
            return 1.0 if len(completion) < 4 else None
        """,
    )
    rewards = load_rewards(
        ["exact", "format:[0-9]+", "partial:only_short", "format:.*"], [1.0, 0.5, 2.0, 0.25]
    )
    assert [reward.name for reward in rewards.rewards] == ["exact", "format", "only_short", "format_2"]
    scores = rewards.score(["p1", "p1", "p2"], ["72", "seventy-two", "7"], ["72", "72", "8"])
    np.testing.assert_array_equal(scores.per_function["exact"], [1, 0, 0])
    np.testing.assert_array_equal(scores.per_function["format"], [1, 0, 1])
    np.testing.assert_array_equal(scores.per_function["only_short"], [1, NAN, 1])
    np.testing.assert_array_equal(scores.per_function["format_2"], [1, 1, 1])
    # TRL's sum: an unscored value counts 0.
    np.testing.assert_array_equal(scores.total, [1 + 0.5 + 2 + 0.25, 0.25, 0.5 + 2 + 0.25])  # dyadic: exact
    assert scores.total.dtype == np.float32

    unscored = load_rewards(["partial:only_short"]).score(["p"], ["long answer"], ["a"])
    assert np.isnan(unscored.total).all()


def test_set_configuration_errors() -> None:
    with pytest.raises(ConfigError, match="rl.rewards is empty"):
        load_rewards([])
    with pytest.raises(
        ConfigError, match=r"rl.reward_weights has 1 weights for 2 rl.rewards \(math, exact\)"
    ):
        load_rewards(["math", "exact"], [1.0])
    with pytest.raises(ConfigError, match="finite"):
        load_rewards(["exact"], [math.inf])
    with pytest.raises(ValueError, match="2 prompts, 1 completions, 1 answers"):
        load_rewards(["exact"]).score(["a", "b"], ["c"], ["d"])


def test_a_failing_reward_names_itself_and_the_example(rewards_folder: Path) -> None:
    write_module(
        rewards_folder,
        "fragile",
        """
        def divide(prompt, completion, answer):
            return 1 / int(completion)

        def word(prompt, completion, answer):
            return "yes"
        """,
    )
    rewards = load_rewards(["exact", "fragile:divide"])
    prompts = ["What is 1 + 1?", "A long prompt\nwith lines " + "and words " * 20]
    with pytest.raises(RewardError) as raised:
        rewards.score(prompts, ["2", "0"], ["2", "0"], records=["train.jsonl:3", "train.jsonl:8"])
    error = raised.value
    assert str(error) == (
        "reward fragile:divide raised ZeroDivisionError: division by zero on example 1 (record train.jsonl:8), "
        "prompt 'A long prompt with lines and words and words and words an...'"
    )
    assert (error.reward, error.example, error.record) == ("fragile:divide", 1, "train.jsonl:8")
    assert isinstance(error.__cause__, ZeroDivisionError)
    assert exit_code_of(error) == 1  # a RunFailure: one line, the run stops with its last checkpoint

    with pytest.raises(RewardError, match=r"^reward fragile:word returned 'yes' \(str\), not a finite float"):
        load_rewards(["fragile:word"]).score(["p"], ["c"], ["a"])
    with pytest.raises(RewardError, match="on example 0, prompt 'p'$"):
        load_rewards(["fragile:divide"]).score(["p"], ["zero"], ["a"])


@pytest.mark.parametrize(("max_length", "buffer"), [(100, 20), (16, 0), (16, 16), (7, 3)])
def test_overlong_penalty_equals_trl(max_length: int, buffer: int) -> None:
    trl_rewards = pytest.importorskip("trl.rewards")
    lengths = list(range(0, max_length + 5))
    expected = trl_rewards.get_soft_overlong_punishment(max_length, buffer)([[1] * n for n in lengths])
    ours = overlong_penalty(lengths, max_completion_length=max_length, buffer=buffer)
    # float64 arithmetic on both sides, ours then rounded once to float32
    np.testing.assert_allclose(ours, expected, rtol=float(np.finfo(np.float32).eps), atol=0)
    assert ours.dtype == np.float32 and ours.min() == -1.0 and ours.max() == 0.0
    with pytest.raises(ValueError, match="between 0 and max_completion_length"):
        overlong_penalty(lengths, max_completion_length=max_length, buffer=max_length + 1)
