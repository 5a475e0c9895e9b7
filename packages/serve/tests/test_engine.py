"""The engine against the model's full forward: greedy tokens and log-probs for every family, prompt
log-probs, stop conditions, cancellation, the n samples of a prompt, and the errors a request can get."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from tiny_models import VOCAB, forward_logprobs, greedy_reference, logprob_tolerance, tiny_model

from halyard.models import CausalLM
from halyard.serve import Engine, EngineConfig, ParameterError, RequestOutput, SampleOutput, SamplingParams
from halyard.serve.detokenizer import Detokenizer

SMALL = EngineConfig(
    page_size=8, num_pages=48, max_context=96, max_running=4, chunk_size=16, max_prefill_rows=2, min_rows=36
)
"""Every step in a program of the most tokens a step holds (4 + 2 x 16): the tests compile one program per
page bucket and log-prob variant, not one per token bucket too (each is a second or more of a test's time;
the smaller token buckets run in the pipelined test below and in test_warmup.py)."""


@functools.cache
def _llama() -> CausalLM:
    """The tests' llama, built at the first call (not when a test worker collects the file)."""
    return tiny_model("llama")


PROMPTS = [[5, 9, 2, 7, 1], [3], list(range(1, 30)), [8, 8, 4, 60, 2, 2, 2, 2, 2, 11]]


@pytest.mark.parametrize("family", ["llama", "mistral", "gpt2", "mixtral", "gemma2", "qwen3"])
def test_greedy_tokens_and_logprobs_equal_the_full_forward(family: str) -> None:
    model = tiny_model(family)
    engine = Engine(model, SMALL)
    outputs = engine.generate(PROMPTS, SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True))
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        tokens, logprobs = greedy_reference(model, prompt, 9)
        sample = output.samples[0]
        assert sample.token_ids == tokens, (family, prompt)
        atol = logprob_tolerance(model, [prompt + tokens])
        np.testing.assert_allclose(sample.logprobs, logprobs, atol=atol, rtol=0)
        assert sample.finish_reason == "length"
    assert engine.pages.in_use == 0 and not engine.has_work


def test_prompt_logprobs_and_top_alternatives_equal_the_full_forward() -> None:
    model = _llama()
    engine = Engine(model, SMALL)
    prompt = list(range(3, 40))  # three chunks of 16
    (output,) = engine.generate([prompt], SamplingParams(max_tokens=2, prompt_logprobs=True, top_logprobs=3))
    reference = forward_logprobs(model, prompt)
    assert output.prompt_logprobs is not None and output.prompt_top_logprobs is not None
    assert output.prompt_logprobs[0] is None and output.prompt_top_logprobs[0] is None
    expected = [reference[i - 1, prompt[i]] for i in range(1, len(prompt))]
    atol = logprob_tolerance(model, [prompt])
    np.testing.assert_allclose(output.prompt_logprobs[1:], expected, atol=atol, rtol=0)
    for position in (1, 17, 36):
        alternatives = output.prompt_top_logprobs[position]
        assert alternatives is not None and len(alternatives) == 3
        best = np.argsort(-reference[position - 1])[:3]
        assert [token for token, _ in alternatives] == best.tolist()
    sample = output.samples[0]
    assert len(sample.top_logprobs) == 2 and all(len(t) == 3 for t in sample.top_logprobs)
    assert sample.top_logprobs[0][0][1] >= sample.logprobs[0] - 1e-6


def test_stop_tokens_eos_and_max_tokens_end_a_sample_with_their_reason() -> None:
    model = _llama()
    greedy, _ = greedy_reference(model, PROMPTS[0], 6)
    stop_at = greedy[3]
    first = greedy.index(stop_at)
    engine = Engine(model, SMALL, eos_token_ids=[])
    by_token, by_length = engine.generate(
        [PROMPTS[0], PROMPTS[0]],
        [
            SamplingParams(max_tokens=6, temperature=0.0, stop_token_ids=(stop_at,)),
            SamplingParams(max_tokens=6, temperature=0.0),
        ],
    )
    assert by_token.samples[0].token_ids == greedy[: first + 1]
    assert (by_token.samples[0].finish_reason, by_token.samples[0].stop_reason) == ("stop", stop_at)
    assert by_length.samples[0].token_ids == greedy and by_length.samples[0].finish_reason == "length"
    eos_engine = Engine(model, SMALL, eos_token_ids=[stop_at])
    (ended,) = eos_engine.generate([PROMPTS[0]], SamplingParams(max_tokens=6, temperature=0.0))
    assert ended.samples[0].token_ids == greedy[: first + 1] and ended.samples[0].finish_reason == "stop"
    (ignored,) = eos_engine.generate(
        [PROMPTS[0]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    )
    assert ignored.samples[0].token_ids == greedy


def test_stop_strings_cut_the_text_and_streaming_never_shows_a_stop_string() -> None:
    model = _llama()
    greedy, _ = greedy_reference(model, PROMPTS[2], 8)

    def decode(ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)

    stop = f"<{greedy[4]}><{greedy[5]}>"
    engine = Engine(model, SMALL, decode=decode, eos_token_ids=[])
    engine.add_request(PROMPTS[2], SamplingParams(max_tokens=8, temperature=0.0, stop=(stop, "never")))
    streamed, updates = "", []
    while engine.has_work:
        for update in engine.step():
            streamed += update.text
            updates.append(update)
            assert stop not in streamed
    expected = decode(greedy[:4])
    assert streamed == expected
    assert updates[-1].finish_reason == "stop" and updates[-1].stop_reason == stop
    assert sum(len(u.token_ids) for u in updates) == 6  # the tokens of the stop string are generated


def test_text_handed_off_shows_the_same_outputs_though_stop_strings_are_found_a_step_late() -> None:
    model = _llama()
    greedy, _ = greedy_reference(model, PROMPTS[2], 8)

    def decode(ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)

    params = SamplingParams(max_tokens=8, temperature=0.9, seed=4, n=3, stop=(f"<{greedy[2]}>", "<7>"))
    (inline,) = Engine(model, SMALL, decode=decode, eos_token_ids=[]).generate([PROMPTS[2]], params)
    engine = Engine(model, SMALL, decode=decode, eos_token_ids=[])
    handed = engine.hand_off_text()
    assert handed is decode
    text = Detokenizer(handed)
    request_id = engine.add_request(PROMPTS[2], params)
    text.add(request_id, params.n, params.stop)
    output = RequestOutput(request_id, PROMPTS[2], [SampleOutput(i) for i in range(params.n)])
    late: list = []
    while engine.has_work:
        updates = engine.step()
        for stop in late:  # as the server's engine thread hears of them: after its next step
            engine.stop_sample(*stop)
        assert all(update.text == "" for update in updates)
        shown, late = text.process(updates)
        for update in shown:
            output.apply(update)
    assert output.samples == inline.samples and len(text) == 0 and engine.pages.in_use == 0
    stopped = [s for s in inline.samples if isinstance(s.stop_reason, str)]
    assert stopped, "no stop string ended a sample: the case tests nothing"
    assert engine.stats.tokens_generated > sum(len(s.token_ids) for s in inline.samples)


def test_a_pipelined_engine_under_preemption_draws_the_greedy_tokens() -> None:
    """The fast mode dispatches step k+1 before fetching step k (its decoding rows' tokens go from program
    to program on the device): with so few pages that sequences are preempted while their last token is
    still being drawn, and stop tokens that end samples with a step already dispatched after them, every
    sample is the full forward's greedy continuation."""
    model = _llama()
    engine = Engine(
        model, EngineConfig(page_size=8, num_pages=12, max_context=96, max_running=4, chunk_size=8)
    )
    prompts = [list(range(1 + i, 21 + i)) for i in range(4)]
    references = [greedy_reference(model, prompt, 30)[0] for prompt in prompts]
    stop = references[1][10]  # ends the second prompt's sample early (maybe others' too)
    params = SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=(stop,), ignore_eos=True)
    outputs = engine.generate(prompts, params)
    assert engine.stats.preemptions > 0 and engine.stats.steps_pipelined > 0
    for output, reference in zip(outputs, references, strict=True):
        expected = reference[: reference.index(stop) + 1] if stop in reference else reference
        assert output.samples[0].token_ids == expected
    while engine.has_work:  # the step dispatched after the last token: nothing more comes of it
        assert engine.step() == []
    assert engine.pages.in_use == 0


def test_cancelling_a_request_frees_its_pages_at_once() -> None:
    model = _llama()
    engine = Engine(model, SMALL)
    keep = engine.add_request(PROMPTS[2], SamplingParams(max_tokens=40, temperature=0.0))
    cancel = engine.add_request(PROMPTS[3], SamplingParams(max_tokens=40, n=3, temperature=1.0, seed=1))
    for _ in range(4):
        engine.step()
    in_use = engine.pages.in_use
    owned = {key for key in engine.pages.owners() if key[0] == cancel}
    assert owned
    engine.cancel(cancel)
    assert not any(key[0] == cancel for key in engine.pages.owners())
    assert engine.pages.in_use < in_use
    updates = engine.step()
    aborted = [u for u in updates if u.request_id == cancel]
    assert sorted(u.index for u in aborted) == [0, 1, 2] and all(u.finish_reason == "abort" for u in aborted)
    while engine.has_work:
        engine.step()
    assert engine.pages.in_use == 0
    assert keep not in [key[0] for key in engine.pages.owners()]


def test_n_samples_share_the_prompt_pages_and_draw_different_continuations() -> None:
    model = _llama()
    engine = Engine(model, SMALL)
    prompt = list(range(1, 21))  # two full pages of 8 and a partial one
    engine.add_request(prompt, SamplingParams(max_tokens=30, n=3, temperature=1.0, seed=3))
    shared_seen = False
    while engine.has_work:
        engine.step()
        owners = engine.pages.owners()
        if len(owners) == 3:
            first_pages = [engine.pages.pages_of(owner)[:2] for owner in owners]
            shared_seen |= first_pages[0] == first_pages[1] == first_pages[2]
    assert shared_seen


def test_a_seeded_request_draws_the_same_tokens_alone_or_among_others() -> None:
    model = _llama()
    target = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, top_k=20, seed=11, logprobs=True)
    alone = Engine(model, SMALL).generate([PROMPTS[2]], target)[0].samples[0]
    crowd = (
        Engine(model, SMALL)
        .generate(
            [PROMPTS[0], PROMPTS[2], PROMPTS[3]],
            [SamplingParams(max_tokens=5, temperature=1.0), target, SamplingParams(max_tokens=20, min_p=0.1)],
        )[1]
        .samples[0]
    )
    assert alone.token_ids == crowd.token_ids
    # other batches, other programs: the same sums in other orders
    atol = logprob_tolerance(model, [PROMPTS[2] + alone.token_ids])
    np.testing.assert_allclose(alone.logprobs, crowd.logprobs, atol=atol, rtol=0)
    other_seed = Engine(model, SMALL).generate(
        [PROMPTS[2]], SamplingParams(max_tokens=12, temperature=0.9, seed=12)
    )
    assert other_seed[0].samples[0].token_ids != alone.token_ids


@pytest.mark.parametrize(
    ("prompt", "params", "parameter"),
    [
        ([], SamplingParams(), "prompt"),
        ([VOCAB], SamplingParams(), "prompt"),
        (list(range(1, 61)) + [1] * 36, SamplingParams(max_tokens=1), "prompt"),
        ([1, 2, 3], SamplingParams(max_tokens=94), "max_tokens"),
        ([1, 2, 3], SamplingParams(stop=("x",)), "stop"),
        ([1, 2, 3], SamplingParams(n=129), "n"),  # above EngineConfig.max_n
        ([1, 2, 3], SamplingParams(n=5, max_tokens=80), "n"),  # 5 x 11 pages, the pool has 48
    ],
)
def test_bad_requests_get_an_error_naming_the_parameter(
    prompt: list[int], params: SamplingParams, parameter: str
) -> None:
    engine = Engine(_llama(), SMALL)
    with pytest.raises(ParameterError) as error:
        engine.add_request(prompt, params)
    assert error.value.parameter == parameter and str(error.value).startswith(parameter)
    assert not engine.has_work
    if params.n == 5:
        assert "need 55 KV pages at once, the pool has 48" in str(error.value)
    if params.n == 129:
        assert "limit of 128" in str(error.value)


def _steps_until_finished(engine: Engine, request_id: str) -> int:
    steps = 0
    while engine.knows(request_id):
        engine.step()
        steps += 1
    return steps


def test_a_request_of_many_samples_does_not_keep_a_small_one_waiting() -> None:
    """12 samples of 24 tokens fill the 4 rows three times over; a one-sample request that comes after
    them runs at once (a big sample is preempted for it) and takes the steps it takes alone. Requests of
    one caller count as one."""
    model = _llama()
    small = SamplingParams(max_tokens=6, temperature=0.0)
    alone = Engine(model, SMALL)
    steps_alone = _steps_until_finished(alone, alone.add_request(PROMPTS[0], small))
    engine = Engine(model, SMALL)
    big = engine.add_request(PROMPTS[3][:5], SamplingParams(max_tokens=24, n=12, seed=1, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert len(engine.scheduler.running) == SMALL.max_running
    preemptions = engine.stats.preemptions
    beside = _steps_until_finished(engine, engine.add_request(PROMPTS[0], small))
    assert beside <= steps_alone + 1 and engine.stats.preemptions > preemptions
    while engine.knows(big):
        engine.step()
    assert engine.pages.in_use == 0
    caller = Engine(model, SMALL)  # four prompts of one caller take the rows the first took: no preemption
    for _ in range(4):
        caller.add_request(PROMPTS[3][:5], SamplingParams(max_tokens=24, ignore_eos=True), caller="one")
    caller.step()
    late = caller.add_request(PROMPTS[0], small, caller="one")
    assert _steps_until_finished(caller, late) > 20 and caller.stats.preemptions == 0


def test_prompt_chunks_fill_the_padding_of_a_steps_program() -> None:
    """A step runs in a program of 36 tokens (SMALL): past its 2 prefill rows, more prompts fill what the
    chunks leave, the last one cut to fit, and their greedy tokens are those of the full forward."""
    model = _llama()
    short = Engine(model, SMALL)
    for first in range(4):
        short.add_request([4 + first, 9, 2, 7, 1], SamplingParams(max_tokens=3))
    short.step()
    assert short.stats.tokens_computed == 4 * 5  # four prompts in one step, not two
    engine = Engine(model, SMALL)
    prompts = {
        engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=0.0)): prompt
        for prompt in (list(range(1 + first, 30 + first)) for first in range(3))
    }
    drawn: dict[str, list[int]] = {request: [] for request in prompts}
    for update in engine.step():
        drawn[update.request_id] += update.token_ids
    assert engine.stats.tokens_computed == 36  # two chunks of 16, then 4 tokens of the third prompt
    assert [sequence.computed for sequence in engine.scheduler.running] == [16, 16, 4]
    while engine.has_work:
        for update in engine.step():
            drawn[update.request_id] += update.token_ids
    for request, prompt in prompts.items():
        assert drawn[request] == greedy_reference(model, prompt, 4)[0]


def test_sampling_parameters_out_of_range_are_refused_naming_them() -> None:
    for name, value in [
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("top_k", -1),
        ("min_p", 1.5),
        ("n", 0),
        ("top_logprobs", 21),
        ("max_tokens", 0),
    ]:
        with pytest.raises(ParameterError) as error:
            SamplingParams(**{name: value})
        assert error.value.parameter == name


def test_weights_handed_over_in_memory_generate_as_the_new_weights_do() -> None:
    old, new = _llama(), tiny_model("llama", seed=5)
    engine = Engine(old, SMALL)
    engine.generate(
        [PROMPTS[2]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    )  # compiled, cached
    compiled = len(engine.runner.compiled_shapes)
    engine.update_weights(new)
    (output,) = engine.generate([PROMPTS[2]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    tokens, logprobs = greedy_reference(new, PROMPTS[2], 6)
    assert output.samples[0].token_ids == tokens
    atol = logprob_tolerance(new, [PROMPTS[2] + tokens])
    np.testing.assert_allclose(output.samples[0].logprobs, logprobs, atol=atol, rtol=0)
    assert len(engine.runner.compiled_shapes) == compiled  # nothing compiled again
    with pytest.raises(ValueError, match="structure and shapes"):
        engine.update_weights(tiny_model("llama", hidden_size=64))
    engine.add_request(PROMPTS[0], SamplingParams(max_tokens=30))
    engine.step()
    with pytest.raises(RuntimeError, match="requests are running"):
        engine.update_weights(old)
