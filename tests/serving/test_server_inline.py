"""`stepgap serve`'s steps while the rollout runs: `/steps` takes a rollout's text so far and
returns at once, `/reward` with the rollouts' `trace_ids` reuses what was checked meanwhile;
a deadline still gets 503 + Retry-After, and a dropped rollout's steps are never asked."""

from __future__ import annotations

import re
import threading

import httpx
import pytest

from stepgap.serving import StepGapReward
from stepgap.serving.server import create_app
from stepgap.teacher import Checker, ReplayNLI
from stepgap.teacher.judges.replay import ReplayJudge
from tests.fixtures.clock import ManualClock
from tests.fixtures.judges import CountingJudge
from tests.fixtures.live_server import LiveServer


def _prefixes(response: str) -> list[str]:
    return [response[: m.end()] for m in re.finditer(r"</(information|tool_response)>", response)]


def _reward(examples_dir, delay: float = 0.0, variant: str = "typed_shape", gate=None):
    judge = CountingJudge(ReplayJudge.from_file(examples_dir / "judge_replay.jsonl"), delay, gate)
    checker = Checker(judge, ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"))
    return StepGapReward(checker, variant), judge


def _final(traces) -> dict:
    return {
        "responses": [t.response for t in traces],
        "questions": [t.question for t in traces],
        "golden_answers": [t.golden_answers for t in traces],
        "trace_ids": [t.id for t in traces],
    }


def test_steps_sent_while_rolling_out_give_the_post_hoc_rewards(
    examples_dir, example_traces, expected_rewards
):
    gate = threading.Event()  # the judge answers nothing until every step is sent
    reward, judge = _reward(examples_dir, gate=gate)
    with LiveServer(create_app(reward)) as url:
        for t in example_traces:
            for text in _prefixes(t.response):
                # answered while the judge cannot answer: /steps returns at once, not after it
                r = httpx.post(f"{url}/steps", json={"trace_id": t.id, "question": t.question,
                                                      "response": text}, timeout=30)  # fmt: skip
                assert r.status_code == 200 and r.json()["submitted"] == 1, r.text
        assert judge.asked == []
        gate.set()
        r = httpx.post(f"{url}/reward", json=_final(example_traces), timeout=60)
        metrics = httpx.get(f"{url}/metrics").text
    assert r.status_code == 200, r.text
    assert r.json()["rewards"] == pytest.approx([expected_rewards[t.id] for t in example_traces])
    # each step asked once: all but the answer steps while the rollouts ran
    assert sorted(judge.asked) == sorted((t.id, s.index) for t in example_traces for s in t.steps)
    assert 'stepgap_requests_total{route="steps"}' in metrics


def test_a_finalize_past_its_deadline_gets_503_with_retry_after(examples_dir, example_traces):
    """On the server's clock (the test's, moved by hand): the judge holds the rollout's steps,
    and when the clock reaches the request's usable time (0.8 s of its 1 s) the answer is 503
    with Retry-After, before the client's own timeout fires."""
    gate = threading.Event()  # the judge answers nothing while the deadline passes
    reward, _ = _reward(examples_dir, gate=gate)
    clock = ManualClock()
    t = example_traces[0]
    with LiveServer(create_app(reward, clock=clock)) as url:
        box: list[httpx.Response] = []
        sender = threading.Thread(
            target=lambda: box.append(httpx.post(
                f"{url}/reward", json=_final([t]), headers={"X-Stepgap-Timeout": "1"}, timeout=60
            ))
        )  # fmt: skip
        sender.start()
        assert clock.waited.wait(60)  # the route waits for the checks, on the clock
        started = clock.now()
        clock.advance_soon(0.8)
        sender.join(60)
        metrics = httpx.get(f"{url}/metrics").text
        gate.set()
    (r,) = box
    assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.text
    assert clock.now() - started == pytest.approx(0.8)  # its usable time, not a second more
    assert 'stepgap_rejected_total{reason="deadline"} 1.0' in metrics


def test_a_dropped_rollouts_steps_are_never_asked(examples_dir, example_traces):
    gate = threading.Event()  # the judge is busy with the first rollout's step until it opens
    reward, judge = _reward(examples_dir, gate=gate)  # a judge in this process: one worker
    first, other = example_traces[0], next(t for t in example_traces if len(t.steps) >= 3)
    with LiveServer(create_app(reward)) as url:

        def send(t) -> None:
            for text in _prefixes(t.response):
                httpx.post(f"{url}/steps", json={"trace_id": t.id, "question": t.question,
                                                 "response": text}, timeout=30)  # fmt: skip

        send(first)
        send(other)
        gone = httpx.delete(f"{url}/steps/{other.id}", timeout=30).json()
        gate.set()
        r = httpx.post(f"{url}/reward", json=_final([first]), timeout=60)  # its steps all end
        metrics = httpx.get(f"{url}/metrics").text
    assert r.status_code == 200, r.text
    assert gone["dropped"] == len(other.steps) - 1  # every step it sent: none was under way
    assert {trace_id for trace_id, _ in judge.asked} == {first.id}
    assert f'stepgap_traces_dropped_total{{reason="abandoned"}} {len(other.steps) - 1}.0' in metrics


def test_a_server_that_checks_no_steps_says_so(examples_dir, example_traces):
    reward, _ = _reward(examples_dir, variant="search_only")
    t = example_traces[0]
    with LiveServer(create_app(reward)) as url:
        r = httpx.post(f"{url}/steps", json={"trace_id": t.id, "question": t.question,
                                             "response": t.response})  # fmt: skip
        final = httpx.post(f"{url}/reward", json=_final([t]))
    assert r.status_code == 404 and "whole rollouts only" in r.json()["detail"]
    assert final.status_code == 200  # trace ids are no error: the rollouts are scored as ever


def test_steps_with_a_feedback_wait_answer_each_gaps_note(examples_dir, example_traces):
    """Typed feedback through `stepgap serve` (`ServedInline.tell`): each step's answer holds
    the note of its post-hoc label once its verdict is in; with the judge held and no wait the
    verdict is too late and no note is sent."""
    import asyncio

    from stepgap.feedback import note_for
    from stepgap.serving.inline import ServedInline

    gate = threading.Event()
    reward, _ = _reward(examples_dir, gate=gate)
    with LiveServer(create_app(reward)) as url:
        served = ServedInline(url)

        async def tell_all(wait: float) -> dict[str, list]:
            return {t.id: [await served.tell(t.id, t.question, text, wait)
                           for text in _prefixes(t.response)] for t in example_traces}  # fmt: skip

        held = asyncio.run(tell_all(0.0))
        gate.set()
        for t in example_traces:
            httpx.delete(f"{url}/steps/{t.id}", timeout=30)
        told = asyncio.run(tell_all(60.0))
    assert all(x.late and x.note is None and x.new_steps == 1 for xs in held.values() for x in xs)
    post_hoc = {t.id: [v.label for v in reward.checker.check([t])[0]] for t in example_traces}
    notes = []
    for t in example_traces:
        assert [x.new_steps for x in told[t.id]] == [1] * len(told[t.id])
        assert not any(x.late for x in told[t.id])
        labels = post_hoc[t.id][: len(told[t.id])]
        assert [x.note for x in told[t.id]] == [note_for(label) for label in labels]
        notes += [x.note for x in told[t.id] if x.note]
    assert notes  # some step is a gap
