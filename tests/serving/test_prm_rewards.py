"""The typed reward of a PRM bundle through TRL's reward function, veRL's compute_score and
OpenRLHF's /get_reward (and slime's /remote_rm) on a live `stepgap serve --bundle` app: the PRM
trained by `accelerate launch student/train.py` with the prm-tiny recipe, exported and loaded
from its bundle; each reward equals `StepGapReward` over the bundle's `PRMChecker`, and a rollout whose steps the PRM could not read (past its window)
never gets a reward that looks typed."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from stepgap.export.bundle import export_bundle
from stepgap.export.offline import load_checker
from stepgap.serving import StepGapReward, process_reward
from stepgap.serving.reward_function import RewardOptions, RewardUnavailable
from stepgap.serving.server import create_app, probe_capacity
from stepgap.serving.streaming import StreamingReward
from stepgap.serving.trl import stepgap_reward_func
from stepgap.serving.verl import compute_score_batch
from stepgap.student.prm import PRM_META, PRMChecker
from stepgap.teacher.build import CheckerConfig
from tests.fixtures.live_server import LiveServer
from tests.serving.conftest import chat_prompt

pytestmark = pytest.mark.timeout(600)


def _bundle(tiny_prm, root, max_length: int | None = None):
    prm = root / "prm"
    shutil.copytree(tiny_prm, prm)
    if max_length is not None:  # a window shorter than any step's marker
        meta = json.loads((prm / PRM_META).read_text())
        meta["format"]["max_length"] = max_length
        (prm / PRM_META).write_text(json.dumps(meta))
    return export_bundle(str(prm), None, root / "bundle", prm_quantize="int8")


@pytest.fixture(scope="module")
def prm_bundle(prm_launched, tmp_path_factory):
    """The PRM `accelerate launch` trained from the example verdicts, in its bundle."""
    return _bundle(prm_launched[0], tmp_path_factory.mktemp("prm"))


@pytest.fixture(scope="module")
def narrow_bundle(tiny_prm, tmp_path_factory):
    """A window of 40 tokens: one step of the built-in parity probe (its marker at 39) and no
    step of the example traces (their first markers at 45 and later)."""
    return _bundle(tiny_prm, tmp_path_factory.mktemp("narrow"), max_length=40)


def _direct(bundle, traces):
    """The oracle: StepGapReward over the bundle's PRMChecker, in process."""
    checker = load_checker(CheckerConfig(bundle=str(bundle)))
    assert isinstance(checker, PRMChecker)
    return StepGapReward(checker).score(
        [t.response for t in traces], [t.question for t in traces],
        [t.golden_answers for t in traces],
    )  # fmt: skip


def _via_frameworks(bundle, traces, tmp_path):
    """(TRL's rewards, veRL's scores or the exception, /get_reward's answer, /reward's) with
    the reward of `bundle` built as each framework builds it."""
    config = tmp_path / f"{bundle.parent.name}.json"
    config.write_text(json.dumps({"bundle": str(bundle)}))
    trl = stepgap_reward_func(RewardOptions().reward(load_checker(CheckerConfig(bundle=str(bundle)))))(
        [chat_prompt(t.question) for t in traces], [t.response for t in traces],
        golden_answers=[t.golden_answers for t in traces], question=[t.question for t in traces],
    )  # fmt: skip
    process_reward.reset()
    try:
        verl = compute_score_batch(
            ["nq"] * len(traces), [t.response for t in traces],
            [{"target": t.golden_answers} for t in traces],
            [{"question": t.question} for t in traces], config=str(config),
        )  # fmt: skip
    except RewardUnavailable as exc:
        verl = exc
    finally:
        process_reward.reset()
    served = RewardOptions().reward(load_checker(CheckerConfig(bundle=str(bundle)), online=True))
    app = create_app(served, max_batch=16, max_wait_ms=5)
    with LiveServer(app) as url:
        body = {
            "query": [chat_prompt(t.question) + t.response for t in traces],
            "prompts": [chat_prompt(t.question) for t in traces],
            "labels": [t.golden_answers for t in traces],
        }
        openrlhf = httpx.post(f"{url}/get_reward", json=body, timeout=120)
        plain = httpx.post(f"{url}/reward", json={
            "responses": [t.response for t in traces], "questions": [t.question for t in traces],
            "golden_answers": [t.golden_answers for t in traces]}, timeout=120).json()  # fmt: skip
        check = httpx.post(f"{url}/check", json={"traces": [traces[0].model_dump(mode="json")]})
        slime = httpx.post(f"{url}/remote_rm", json={  # slime's remote_rm payload, one sample
            "prompt": chat_prompt(traces[0].question), "response": traces[0].response,
            "label": traces[0].golden_answers}, timeout=120)  # fmt: skip
    assert app.state.stepgap.inline is None  # a PRM checks no step while a rollout runs
    return trl, verl, openrlhf, plain, check, slime, served


def test_the_bundled_prm_is_the_trained_one(prm_bundle, pool):
    """The bundle labels the steps it was trained on as the teacher did (its random base does
    not: tests/student/test_prm_train.py), so the rewards below are a trained PRM's."""
    from stepgap.student.mining import pool_traces

    checker = load_checker(CheckerConfig(bundle=str(prm_bundle)))
    teacher = {(v.trace_id, v.step): v.label for v in pool}
    trained = set(json.loads((prm_bundle / "student" / PRM_META).read_text())["train_trace_ids"])
    traces = [t for t in pool_traces(pool) if t.id in trained]
    verdicts = [v for vs in checker.check(traces) for v in vs]
    agree = sum(v.label == teacher[(v.trace_id, v.step)] for v in verdicts) / len(verdicts)
    assert len(verdicts) == 21 and agree >= 0.8, agree


def test_prm_rewards_through_trl_verl_and_openrlhf_equal_the_direct_reward(
    prm_bundle, example_traces, tmp_path
):
    traces = [t for t in example_traces if t.response][:4]
    direct = _direct(prm_bundle, traces)
    assert all(r.unavailable is None and r.steps for r in direct)  # every step labelled
    expected = [r.reward for r in direct]
    trl, verl, openrlhf, plain, check, slime, served = _via_frameworks(prm_bundle, traces, tmp_path)
    assert trl == pytest.approx(expected)
    assert [s["score"] for s in verl] == pytest.approx(expected)
    assert openrlhf.status_code == 200, openrlhf.text
    assert openrlhf.json()["rewards"] == pytest.approx(expected)
    assert plain["rewards"] == pytest.approx(expected)
    assert slime.status_code == 200 and slime.json() == pytest.approx(expected[0])
    assert check.status_code == 200, check.text
    (verdicts,) = check.json()["verdicts"]
    assert all(len(v["path"]) == 1 and v["label"] for v in verdicts)
    message = probe_capacity(served, create_app(served).state.stepgap.batcher, 60)
    assert message.startswith("a PRM checker (prm:") and "no judge" in message


def test_a_prm_that_reads_no_step_gives_no_typed_reward_anywhere(
    narrow_bundle, example_traces, tmp_path
):
    traces = [t for t in example_traces if t.response][:2]
    direct = _direct(narrow_bundle, traces)
    assert all(r.reward is None and "past the PRM's window" in r.unavailable for r in direct)
    trl, verl, openrlhf, plain, _, slime, _ = _via_frameworks(narrow_bundle, traces, tmp_path)
    assert trl == [None, None]
    assert isinstance(verl, RewardUnavailable) and "past the PRM's window" in str(verl)
    assert openrlhf.status_code == 503
    assert openrlhf.json()["detail"]["rewards"] == [None, None]
    assert plain["rewards"] == [None, None]
    assert slime.status_code == 503  # slime retries; it never reads a number for this sample


def test_inline_step_checking_refuses_a_prm_in_one_line(prm_bundle):
    reward = StepGapReward(load_checker(CheckerConfig(bundle=str(prm_bundle))))
    with pytest.raises(TypeError, match="PRM checker reads whole traces"):
        StreamingReward(reward)
