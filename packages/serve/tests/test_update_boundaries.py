"""A sample's text and ending do not depend on how its tokens are grouped into updates (issue 70's flake).

A pipelined step's tokens are fetched at the next step; when that step runs several programs (deterministic
mode, more sequences than ``deterministic_rows``; or a row under a grammar) it fetches its own too, so a
sample gets two tokens in one update. The text of the first was lost when the second was a stop token: the
load test streamed ``''`` where the request sent again alone gave ``'of'`` (both ``stop``)."""

from __future__ import annotations

import functools

from tiny_models import tiny_model

from halyard.models import CausalLM
from halyard.serve import Engine, EngineConfig, SampleOutput, SamplingParams
from halyard.serve.detokenizer import Detokenizer
from halyard.serve.outputs import Update

ONE_ROW = EngineConfig(
    page_size=8, num_pages=24, max_context=64, max_running=4, chunk_size=16, max_prefill_rows=2,
    min_rows=33, deterministic=True, deterministic_rows=1,
)  # fmt: skip
"""One sequence a program, one program size (1 + 2 x 16 tokens): a step of two sequences runs two programs."""
TARGET = [5, 9, 2, 7, 1]
OTHER = [3, 4, 8]


@functools.cache
def _model() -> CausalLM:
    return tiny_model("llama")


def _decode(ids: list[int]) -> str:
    return "".join(f"<{i}>" for i in ids)


def _engine() -> Engine:
    return Engine(_model(), ONE_ROW, decode=_decode, eos_token_ids=[])


def _run(engine: Engine, params: SamplingParams, joined: bool) -> tuple[SampleOutput, list[Update]]:
    """The target's sample and its updates: alone, or with another request joining after its first step
    (the step that draws its second token then runs two programs)."""
    request_id = engine.add_request(TARGET, params)
    sample, updates = SampleOutput(0), []
    first = True
    while engine.has_work:
        shown = engine.step()
        if first and joined:
            engine.add_request(OTHER, SamplingParams(max_tokens=4, temperature=0.0))
        first = False
        for update in shown:
            if update.request_id == request_id:
                updates.append(update)
                sample.token_ids += update.token_ids
                sample.text += update.text
                sample.finish_reason, sample.stop_reason = update.finish_reason, update.stop_reason
    return sample, updates


def test_a_token_before_a_stop_token_in_the_same_update_keeps_its_text() -> None:
    engine = _engine()
    greedy, _ = _run(engine, SamplingParams(max_tokens=4, temperature=0.0), joined=False)
    first, second = greedy.token_ids[:2]
    assert first != second, greedy.token_ids  # the stop token below must not end the sample at its first
    params = SamplingParams(max_tokens=4, temperature=0.0, stop_token_ids=(second,))
    alone, _ = _run(engine, params, joined=False)
    joined, updates = _run(engine, params, joined=True)
    assert [len(u.token_ids) for u in updates if u.token_ids] == [2]  # both tokens in one update
    expected = ([first, second], _decode([first]), "stop", second)
    assert (alone.token_ids, alone.text, alone.finish_reason, alone.stop_reason) == expected
    assert (joined.token_ids, joined.text, joined.finish_reason, joined.stop_reason) == expected


def test_a_stop_string_before_a_stop_token_in_the_same_update_ends_the_sample_there() -> None:
    engine = _engine()
    greedy, _ = _run(engine, SamplingParams(max_tokens=4, temperature=0.0), joined=False)
    first, second = greedy.token_ids[:2]
    params = SamplingParams(max_tokens=4, temperature=0.0, stop_token_ids=(second,), stop=(_decode([first]),))
    alone, _ = _run(engine, params, joined=False)
    joined, updates = _run(engine, params, joined=True)
    expected = ([first], "", "stop", _decode([first]))
    assert (alone.token_ids, alone.text, alone.finish_reason, alone.stop_reason) == expected
    assert (joined.token_ids, joined.text, joined.finish_reason, joined.stop_reason) == expected
    assert len(updates[-1].logprobs) == len(updates[-1].top_logprobs) == 1  # cut with its tokens


def test_held_text_is_shown_when_a_sample_ends_without_a_token() -> None:
    """Text held back because a stop string could still start there is shown when the sample ends by an
    update without tokens (cancelled)."""
    text = Detokenizer(_decode)
    text.add("r", 1, ("<1><2>",))
    (shown,), _ = text.process([Update("r", 0, [7, 1], "", [0.0] * 2, [0.0] * 2, [[], []])])
    assert shown.text == "<7>"  # "<1>" could still grow into the stop string
    (ended,), _ = text.process([Update("r", 0, [], "", [], [], [], "abort")])
    assert ended.text == "<1>"
