"""The loss-spike test (a rolling z-score), the worst rows of a step, flattened per-layer arrays, and the
spike log a resumed run trims."""

from __future__ import annotations

import math

import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance

from halyard.train.watch.config import SpikeConfig, WatchConfig
from halyard.train.watch.host import flatten_arrays, worst_rows
from halyard.train.watch.spikes import SpikeLog, SpikeTest, read_spikes


def test_a_loss_far_above_the_recent_steps_is_a_spike_and_stays_out_of_the_window():
    test = SpikeTest(SpikeConfig(zscore=4.0, window=10, min_steps=5))
    rng = np.random.default_rng(0)
    losses = list(3.0 + 0.01 * rng.standard_normal(12))
    assert [test.check(step, loss) for step, loss in enumerate(losses[:4], 1)] == [None] * 4  # warming up
    assert all(test.check(step, loss) is None for step, loss in enumerate(losses[4:], 5))
    recent = list(test.recent)
    zscore, mean, std = test.check(13, 3.5)
    # float64 throughout: fsum's mean against numpy's pairwise one (10 additions, the division); the std's
    # deviations round at the losses' size (3, where the std is 0.01), then their 10 squares and the root
    assert mean == pytest.approx(np.mean(recent), rel=0, abs=summation_tolerance(recent, 11, np.float64))
    deviation = summation_tolerance(recent, 13, np.float64) + summation_tolerance(
        std, 12 + FUNCTION_TERMS, np.float64
    )
    assert std == pytest.approx(np.std(recent), rel=0, abs=deviation)
    assert zscore == (3.5 - mean) / std and zscore > 4  # the test's own operations on the same floats
    assert list(test.recent) == recent  # the spike is not part of the next steps' baseline
    assert test.check(14, 3.5) is not None  # so the next one is found too
    assert test.check(15, math.nan) is None and test.check(16, 2.0) is None  # low losses are no spikes


def test_a_flat_curve_needs_more_than_noise_and_zero_turns_the_test_off():
    flat = SpikeTest(SpikeConfig(zscore=6.0, window=5, min_steps=5))
    for step in range(5):
        flat.check(step, 2.0)
    assert flat.check(6, 2.01) is None  # std floor: 0.1% of the mean
    assert flat.check(7, 2.05) is not None
    off = SpikeTest(SpikeConfig(zscore=0, window=5, min_steps=5))
    assert all(off.check(step, 100.0 * step) is None for step in range(20))


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(zscore=-1), "trainer.spikes.zscore=-1"),
        (dict(window=1), "trainer.spikes.window=1"),
        (dict(window=10, min_steps=20), "trainer.spikes.min_steps=20"),
        (dict(worst_examples=-2), "trainer.spikes.worst_examples=-2"),
    ],
)
def test_bad_spike_settings_name_the_key(fields, message):
    with pytest.raises(ValueError, match=message):
        SpikeConfig(**fields)


def test_watch_settings():
    assert (
        not WatchConfig().enabled
        and WatchConfig(every=100).watches(200)
        and not WatchConfig(every=100).watches(150)
    )
    assert not WatchConfig(every=1, norms=False, model=False, histograms=False).enabled
    with pytest.raises(ValueError, match="trainer.watch.every=-1"):
        WatchConfig(every=-1)


def test_worst_rows_rank_by_loss_per_token_and_arrays_flatten_by_index():
    examples = {"loss": np.array([10.0, 30.0, 8.0, 0.0]), "tokens": np.array([10, 10, 2, 0])}
    assert worst_rows(examples, 2) == [(2, 4.0, 2), (1, 3.0, 10)]
    assert [row for row, _, _ in worst_rows(examples, 10)] == [2, 1, 0]  # a row without tokens is left out
    flat = flatten_arrays({"a": np.float32(1.5), "b/layers": np.array([1.0, 2.0]), "c": np.ones((2, 2))})
    assert flat == {
        "a": 1.5,
        "b/layers/0": 1.0,
        "b/layers/1": 2.0,
        "c/0/0": 1.0,
        "c/0/1": 1.0,
        "c/1/0": 1.0,
        "c/1/1": 1.0,
    }


def test_a_resumed_run_drops_the_spikes_after_its_checkpoint(tmp_path):
    log = SpikeLog(tmp_path / "spikes.jsonl")
    for step in (5, 12, 20):
        log.write({"step": step, "loss": 1.0})
    SpikeLog(tmp_path / "spikes.jsonl", resume_step=13)
    assert [record["step"] for record in read_spikes(tmp_path)] == [5, 12]
    assert read_spikes(tmp_path / "elsewhere") == []
