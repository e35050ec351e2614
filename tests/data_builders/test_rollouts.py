"""`stepgap rollouts`: a tiny trained policy searches a real Wikipedia index through the
Search-R1 loop; stop strings, interleaved evidence, the QA readers, and resume after SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from stepgap.data_builders.policies import HFPolicy
from stepgap.data_builders.qa import iter_questions, parse_columns
from stepgap.data_builders.retrieval import LocalIndex, format_passages
from stepgap.data_builders.rollout_formats import (
    INVALID_ACTION,
    SEARCH_R1_TEMPLATE,
    Generation,
    Rollout,
)
from stepgap.data_builders.rollouts import run_rollouts
from stepgap.feedback import FeedbackSource, Told, note_for
from stepgap.segment import segment_response
from stepgap.serving.retrieval_server import create_app
from tests.data_builders.conftest import QUESTIONS, TOPK, LiveServer

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]


class Recording:
    """Wraps a policy and keeps every turn it generated."""

    def __init__(self, policy) -> None:
        self.policy, self.name, self.turns = policy, policy.name, []

    def generate(self, rollouts, stops):
        gens = self.policy.generate(rollouts, stops)
        self.turns.append(gens)
        return gens


@pytest.mark.slow  # trains the tiny policy (~15-25 s on 2 shared cores), shared by the next ones
def test_tiny_policy_stops_at_tags_and_interleaves_retrieved_evidence(
    search_policy, wiki_bm25, qa_file, tmp_path
):
    index = LocalIndex(wiki_bm25)
    policy = Recording(HFPolicy(str(search_policy), device="cpu", temperature=0))
    out = tmp_path / "traces.jsonl"
    summary = run_rollouts(iter_questions(qa_file), policy, index, out, topk=TOPK, progress=False)
    assert (summary.traces, summary.failed, summary.searches) == (4, 0, 4)
    assert summary.finish == {"answer": 4}
    # Turn 1 stopped right at </search>, turn 2 right at </answer>: nothing generated after.
    assert len(policy.turns) == 2
    for turn, stop in zip(policy.turns, ["</search>", "</answer>"], strict=True):
        assert [g.stop for g in turn] == [stop] * 4
        assert all(g.text.rstrip().endswith(stop) for g in turn)
    traces = [json.loads(x) for x in out.read_text().splitlines()]
    assert [t["id"] for t in traces] == [q[0] for q in QUESTIONS]
    for trace, (_, _, title, answer) in zip(traces, QUESTIONS, strict=True):
        response = trace["response"]
        hits = index.search([title], TOPK)[0]
        # The evidence is the retriever's answer to the model's own query, Search-R1-formatted.
        info = f"\n\n<information>{format_passages(hits).strip()}</information>\n\n"
        assert info in response, (response, info)
        turn1, rest = response.split(info)
        assert turn1 == f"<think>I need to find {title}.</think>\n<search> {title} </search>"
        assert rest.endswith(f"<answer> {answer} </answer>")
        steps = segment_response(response)  # what `segment`, `label` and `reward` read
        assert [s.type for s in steps] == ["inference", "conclusion"]
        assert steps[0].query == title and steps[0].evidence[0].title == title
        assert steps[1].answer == answer
        assert trace["rollout"]["searches"] == 1 and trace["golden_answers"] == [answer]
    # Without the stop strings the same model writes on past </search> (its own made-up text
    # where the evidence belongs): the stop is what ends the turn.
    start = Rollout(
        iter_questions(qa_file).__next__(),
        0,
        "x",
        [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(question=QUESTIONS[0][1])}],
    )
    policy.policy.max_new_tokens = 40
    (free,) = policy.policy.generate([start], [])
    assert free.stop == "length" and free.text.split("</search>", 1)[1].strip()


class _Scripted:
    """A policy that replays given turns (for the loop's bookkeeping, not for generation)."""

    name = "scripted"

    def __init__(self, turns: list[str]) -> None:
        self.turns = list(turns)

    def generate(self, rollouts, stops):
        return [Generation(self.turns.pop(0), "eos") for _ in rollouts]


def test_the_progress_has_its_total_before_the_first_rollout(wiki_bm25, tmp_path, capsys):
    """The rollouts to run (less those a resumed output has) are counted before the first
    wave, so a log shows `0/3 traces` as it starts and the time left as it goes."""
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"id": i, "question": "Where is the Eiffel Tower",
                                      "answer": "Paris"}) + "\n" for i in ("x", "y")))  # fmt: skip
    out = tmp_path / "t.jsonl"
    out.write_text(json.dumps({"id": "x#0"}) + "\n")  # one of the four already rolled out
    policy = _Scripted(["<answer> Paris </answer>"] * 3)
    summary = run_rollouts(iter_questions(qa), policy, LocalIndex(wiki_bm25), out,
                           n_per_question=2, topk=1)  # fmt: skip
    assert (summary.questions, summary.skipped, summary.traces) == (2, 1, 3)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("rollouts: ")]
    assert lines[0].startswith("rollouts: 0/3 traces, ")
    assert lines[-1].startswith("rollouts: 3/3 traces, ")


def test_search_r1_loop_cuts_turns_notes_invalid_actions_and_stops_after_max_turns(
    wiki_bm25, tmp_path
):
    qa = tmp_path / "qa.jsonl"
    qa.write_text(
        json.dumps({"id": "x", "question": "Where is the Eiffel Tower", "answer": "Paris"})
    )
    # Turn 1 overshoots past </search> (cut there, as _postprocess_responses does), turn 2 has
    # no action (Search-R1's note), turn 3 (the last, max_turns=2) searches: left unanswered.
    policy = _Scripted(
        [
            "<search> Eiffel Tower </search> junk <answer> no </answer>",
            "I am not sure.",
            "<search> Paris </search>",
        ]
    )
    out = tmp_path / "t.jsonl"
    summary = run_rollouts(
        iter_questions(qa), policy, LocalIndex(wiki_bm25), out, max_turns=2, topk=1, progress=False
    )
    (trace,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert summary.finish == {"max_turns": 1} and trace["rollout"]["turns"] == 3
    hit = LocalIndex(wiki_bm25).search(["Eiffel Tower"], 1)[0]
    info = f"\n\n<information>{format_passages(hit).strip()}</information>\n\n"
    first = "<search> Eiffel Tower </search>" + info + "I am not sure."
    # The policy was shown Search-R1's note; the trace leaves it out, since its literal
    # `<search> and </search>` would segment as a search for "and".
    assert trace["rollout"]["transcript"] == first + INVALID_ACTION + "<search> Paris </search>"
    assert trace["response"] == first + "<search> Paris </search>"
    assert trace["rollout"]["invalid_turns"] == 1
    assert [s.query for s in segment_response(trace["response"])] == ["Eiffel Tower", "Paris"]
    assert [s.query for s in segment_response(trace["rollout"]["transcript"])][1] == "and"
    assert trace["question"] == "Where is the Eiffel Tower" and trace["golden_answers"] == ["Paris"]


def test_qa_readers_understand_search_r1_hotpotqa_musique_and_a_column_map(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    prompt = SEARCH_R1_TEMPLATE.format(question="who wrote dracula?")
    table = pa.Table.from_pylist(
        [
            {
                "data_source": "nq",
                "prompt": [{"role": "user", "content": prompt}],
                "reward_model": {"style": "rule", "ground_truth": {"target": ["Bram Stoker"]}},
                "extra_info": {"split": "test", "index": 7},
            }
        ]
    )
    pq.write_table(table, tmp_path / "test.parquet")
    (item,) = iter_questions(tmp_path / "test.parquet")
    assert (item.id, item.question, item.golden_answers) == (
        "test-7", "who wrote dracula?", ["Bram Stoker"]
    )  # fmt: skip
    assert item.prompt == [{"role": "user", "content": prompt}]  # used as is by the loop

    rows = [
        {"_id": "5a8b", "question": "Q1?", "answer": "yes", "type": "comparison"},  # HotpotQA
        {"id": "2hop_1", "question": "Q2?", "answer": "A", "answer_aliases": ["B"]},  # MuSiQue
        {"id": "2hop_2", "answer": "A"},  # no question
        {"id": "5a8b-dup", "question": "Q3?", "answer": {"bad": 1}},  # answers of a wrong type
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from stepgap.io import ErrorReport

    report = ErrorReport()
    items = list(iter_questions(path, report=report))
    assert [(i.id, i.golden_answers) for i in items] == [("5a8b", ["yes"]), ("2hop_1", ["A", "B"])]
    assert [str(e) for e in report.errors] == [
        f"{path}:3: question: no question (a non-empty string) in this row",
        f"{path}:4: answer: answers must be a string or a list of strings",
    ]
    mapped = tmp_path / "custom.jsonl"
    mapped.write_text(json.dumps({"qid": 3, "q": {"text": "Q?"}, "gold": ["x", "y"]}) + "\n")
    (item,) = iter_questions(mapped, columns="id=qid,question=q.text,answers=gold")
    assert (item.id, item.question, item.golden_answers) == ("3", "Q?", ["x", "y"])
    with pytest.raises(ValueError, match="unknown field 'qustion'"):
        parse_columns("qustion=q")


def _rollouts_cmd(qa: Path, policy: Path, url: str, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "stepgap.cli", "rollouts", str(qa), "--policy", f"hf:{policy}",
        "--retriever", f"{url}/retrieve", "-o", str(out), "--temperature", "0", "--device", "cpu",
        "--n-per-question", "2", "--wave-size", "1", "--topk", str(TOPK), "--no-progress", *extra,
    ]  # fmt: skip


class GatedIndex:
    """The real index behind the server, holding every request after the first `allow`."""

    def __init__(self, index: LocalIndex, allow: int) -> None:
        self.index, self.allow, self.queries = index, allow, []
        self.gate = threading.Event()
        self.meta = index.meta

    def search(self, queries, topk):
        self.queries.append(list(queries))
        if len(self.queries) > self.allow:
            self.gate.wait(120)
        return self.index.search(queries, topk)


@pytest.mark.slow  # three CLI processes, each loading torch and the policy
def test_sigkill_mid_run_then_rerun_writes_every_trace_once(
    search_policy, wiki_bm25, qa_file, tmp_path
):
    out = tmp_path / "traces.jsonl"
    gated = GatedIndex(LocalIndex(wiki_bm25), allow=3)
    with LiveServer(create_app(gated)) as url:
        cmd = _rollouts_cmd(qa_file, search_policy, url, out)
        proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while len(gated.queries) < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert len(gated.queries) == 4, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.5)  # the 4th rollout waits on its search; three are written
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        first = [json.loads(x)["id"] for x in out.read_text().splitlines()]
        assert first == ["q-2001#0", "q-2001#1", "q-eiffel#0"]
        gated.gate.set()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "5 trace(s) written, 3 already done" in done.stderr
        again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        assert again.returncode == 0 and "0 trace(s) written, 8 already done" in again.stderr
    traces = [json.loads(x) for x in out.read_text().splitlines()]
    ids = Counter(t["id"] for t in traces)
    assert len(ids) == 8 and set(ids.values()) == {1}
    assert all(t["rollout"]["finish"] == "answer" for t in traces)
    # The rerun searched only for the rollouts that were not written: 4 before the kill
    # (the last one lost), 5 after it.
    assert [q for (q,) in gated.queries] == [
        "2001: A Space Odyssey", "2001: A Space Odyssey", "Eiffel Tower", "Eiffel Tower",
        "Eiffel Tower", "Dracula", "Dracula", "Burj Khalifa", "Burj Khalifa",
    ]  # fmt: skip


def _chat_server(model_dir: Path):
    """A small OpenAI-compatible chat server over a real model, as vLLM answers: the chat
    template, `continue_final_message`, greedy decoding, `stop` strings cut from the text."""
    import torch
    from fastapi import FastAPI
    from transformers import AutoModelForCausalLM

    from stepgap.models import load_tokenizer

    tok = load_tokenizer(str(model_dir))  # the stand-in's tokenizer as saved (stepgap.models)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    app, seen = FastAPI(), []

    @app.post("/v1/chat/completions")
    def chat(body: dict) -> dict:
        seen.append(body)
        cont = bool(body.get("continue_final_message"))
        prompt = tok.apply_chat_template(
            body["messages"], add_generation_prompt=not cont, continue_final_message=cont,
            tokenize=False,
        )  # fmt: skip
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **ids, max_new_tokens=body["max_tokens"], do_sample=False, tokenizer=tok,
                stop_strings=body.get("stop") or None, pad_token_id=tok.pad_token_id,
            )  # fmt: skip
        text = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        cut = [text.index(s) for s in body.get("stop") or [] if s in text]
        finish = "stop" if cut or out[0, -1] == tok.eos_token_id else "length"
        message = {"role": "assistant", "content": text[: min(cut)] if cut else text}
        return {
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }  # fmt: skip

    return app, seen


def test_openai_policy_continues_the_turn_on_a_server_and_writes_the_same_traces(
    search_policy, wiki_bm25, qa_file, tmp_path
):
    from stepgap.data_builders.policies import OpenAIPolicy

    index = LocalIndex(wiki_bm25)
    local = tmp_path / "hf.jsonl"
    hf = HFPolicy(str(search_policy), device="cpu", temperature=0)
    run_rollouts(iter_questions(qa_file), hf, index, local, topk=TOPK, progress=False)
    app, seen = _chat_server(search_policy)
    with LiveServer(app) as url:
        policy = OpenAIPolicy("tiny", base_url=f"{url}/v1", temperature=0, concurrency=4)
        out = tmp_path / "api.jsonl"
        summary = run_rollouts(
            iter_questions(qa_file), policy, index, out, topk=TOPK, progress=False
        )
    assert (summary.traces, summary.failed, summary.finish) == (4, 0, {"answer": 4})
    api = [json.loads(x)["response"] for x in out.read_text().splitlines()]
    assert api == [json.loads(x)["response"] for x in local.read_text().splitlines()]
    # Turn 2 continued the assistant's own text (no new turn) and stopped at the tags.
    second = [b for b in seen if b.get("continue_final_message")]
    assert len(second) == 4 and all(b["messages"][-1]["role"] == "assistant" for b in second)
    assert all(b["stop"] == ["</search>", "</answer>"] for b in seen)


class _Turns:
    """A policy that replays given generations and keeps the conversations it was shown."""

    name = "scripted"

    def __init__(self, gens: list[Generation]) -> None:
        self.gens, self.seen = list(gens), []

    def generate(self, rollouts, stops):
        self.seen.append([list(r.messages) for r in rollouts])
        return [self.gens.pop(0) for _ in rollouts]


@pytest.mark.parametrize("native", [False, True], ids=["text-tool-call", "api-tool-call"])
def test_hermes_format_round_trips_tool_calls_into_segmentable_traces(wiki_bm25, tmp_path, native):
    qa = tmp_path / "qa.jsonl"
    qa.write_text(
        json.dumps({"id": "h", "question": "Where is the Eiffel Tower?", "answer": "Paris"})
    )
    args = {"query": "Eiffel Tower"}
    first = (
        Generation(
            "Let me look.", "</tool_call>", {"name": "search", "arguments": args, "id": "c1"}
        )
        if native
        else Generation(
            'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query": "Eiffel Tower"}}'
            "\n</tool_call> trailing",
            "</tool_call>",
        )
    )
    policy = _Turns([first, Generation("It is in Paris. <answer> Paris </answer>", "</answer>")])
    out = tmp_path / "h.jsonl"
    index = LocalIndex(wiki_bm25)
    run_rollouts(iter_questions(qa), policy, index, out, fmt="hermes", topk=1, progress=False)
    (trace,) = [json.loads(x) for x in out.read_text().splitlines()]
    body = format_passages(index.search(["Eiffel Tower"], 1)[0]).strip()
    assert trace["response"] == (
        'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query": "Eiffel Tower"}}\n'
        f"</tool_call>\n<tool_response>\n{body}\n</tool_response>\n"
        "It is in Paris. <answer> Paris </answer>"
    )
    steps = segment_response(trace["response"])
    assert [(s.type, s.query, s.answer) for s in steps] == [
        ("inference", "Eiffel Tower", None),
        ("conclusion", None, "Paris"),
    ]
    assert steps[0].claim == "Let me look." and steps[0].evidence[0].title == "Eiffel Tower"
    # What the policy saw on turn 2: its call, then the documents as the tool's answer.
    call, answer = policy.seen[1][0][-2:]
    if native:
        assert call["tool_calls"][0]["id"] == "c1" and call["content"] == "Let me look."
        assert answer == {"role": "tool", "tool_call_id": "c1", "content": body}
    else:
        assert call["role"] == "assistant" and call["content"].endswith("</tool_call>")
        assert answer == {"role": "user", "content": f"<tool_response>\n{body}\n</tool_response>"}


def test_exclude_ids_and_several_rollouts_per_question(wiki_bm25, tmp_path):
    from stepgap.data_builders.rollouts import rollouts_file

    qa = tmp_path / "qa.jsonl"
    rows = [{"_id": f"q{i}", "question": f"Question {i}?", "answer": "x"} for i in range(3)]
    qa.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gold = tmp_path / "gold_ids.txt"
    gold.write_text("q1\n")
    policy = _Scripted(["<answer> x </answer>"] * 4)
    out = tmp_path / "t.jsonl"
    summary = rollouts_file(
        qa, policy, LocalIndex(wiki_bm25), out, exclude_ids=[gold], n_per_question=2,
        progress=False,
    )  # fmt: skip
    traces = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(t["id"], t["question_id"], t["sample"]) for t in traces] == [
        ("q0#0", "q0", 0), ("q0#1", "q0", 1), ("q2#0", "q2", 0), ("q2#1", "q2", 1),
    ]  # fmt: skip
    assert summary.questions == 2 and summary.finish == {"answer": 4}


def test_a_policy_server_that_never_answers_fails_the_first_wave_after_one_retry(
    fake_openai, wiki_bm25, qa_file, tmp_path
):
    """Until the policy server has answered once, a request is retried once, not `max_retries`
    times: a wrong or dead server is a clear error within seconds (it took 22 s of backoff,
    7 requests per rollout), while a server that has answered keeps the full retries."""
    from stepgap.data_builders.policies import OpenAIPolicy

    fake_openai.always = "500"
    policy = OpenAIPolicy("m", base_url=fake_openai.base_url, max_retries=6, concurrency=4)
    questions = list(iter_questions(qa_file))
    with pytest.raises(ValueError, match="all failed"):
        run_rollouts(questions, policy, LocalIndex(wiki_bm25), tmp_path / "r.jsonl", progress=False)
    assert len(fake_openai.events) == 2 * len(questions)  # each: the request and one retry
    assert not policy.working and policy.client.max_retries == 6


class _Noting(FeedbackSource):
    """Typed feedback whose first verdict comes too late and whose others are MB gaps."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []
        self.dropped: list[str] = []

    async def tell(self, trace_id, question, text, wait=0.0):
        self.calls.append((trace_id, text, wait))
        return Told(late=True) if len(self.calls) == 1 else Told(note_for("MB"), False, 0.25)

    async def drop(self, trace_id):
        self.dropped.append(trace_id)


class _Prefixes(_Scripted):
    """What the policy was shown at each turn."""

    shown: list[str]

    def generate(self, rollouts, stops):
        self.shown.append(rollouts[0].prefix)
        return super().generate(rollouts, stops)


def test_typed_feedback_goes_back_with_the_retrieval_and_the_trace_checks_as_without(
    wiki_bm25, tmp_path
):
    """Search-R1's loop with feedback on: a note that came goes after its step's
    `<information>`, to the policy and into the trace, where segmentation leaves it out; one too
    late is not sent; the record counts both and the time waited."""
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"id": "x", "question": "Where is the Eiffel Tower", "answer": "P"}))
    policy = _Prefixes(["<search> Eiffel Tower </search>", "<search> Paris </search>",
                        "<answer> Paris </answer>"])  # fmt: skip
    policy.shown = []
    source, out = _Noting(), tmp_path / "t.jsonl"
    run_rollouts(iter_questions(qa), policy, LocalIndex(wiki_bm25), out, max_turns=3, topk=1,
                 progress=False, feedback=source, feedback_wait=2.5)  # fmt: skip
    (trace,) = [json.loads(x) for x in out.read_text().splitlines()]
    note = note_for("MB")
    assert trace["response"].count(note) == 1 and f"</information>\n\n{note}" in trace["response"]
    assert policy.shown[-1].endswith(f"{note}\n\n")  # the policy read it on its next turn
    assert note not in policy.shown[1]  # the first step's verdict was too late: nothing sent
    assert trace["rollout"]["feedback"] == {"notes": 1, "too_late": 1, "waited_s": 0.25}
    assert [w for _, _, w in source.calls] == [2.5, 2.5] and source.dropped == ["x"]
    plain = trace["response"].replace(note + "\n\n", "")
    assert _steps(trace["response"]) == _steps(plain)


def test_typed_feedback_sits_inside_a_hermes_tool_response(wiki_bm25, tmp_path):
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"id": "h", "question": "Where is the Eiffel Tower?", "answer": "P"}))
    call = '<tool_call>\n{{"name": "search", "arguments": {{"query": "{}"}}}}\n</tool_call>'
    policy = _Turns([Generation(call.format("Eiffel Tower"), "</tool_call>"),
                     Generation(call.format("Paris"), "</tool_call>"),
                     Generation("<answer> Paris </answer>", "</answer>")])  # fmt: skip
    out = tmp_path / "h.jsonl"
    run_rollouts(iter_questions(qa), policy, LocalIndex(wiki_bm25), out, fmt="hermes", topk=1,
                 progress=False, feedback=_Noting())  # fmt: skip
    (trace,) = [json.loads(x) for x in out.read_text().splitlines()]
    note = note_for("MB")
    assert f"\n{note}\n</tool_response>" in trace["response"]
    answer = policy.seen[2][0][-1]
    assert answer["role"] == "user" and answer["content"].endswith(f"\n{note}\n</tool_response>")
    plain = trace["response"].replace(f"\n{note}", "")
    assert _steps(trace["response"]) == _steps(plain) and len(_steps(plain)) == 3


def _steps(response: str) -> list:
    return [(s.type, s.claim, s.query, s.answer, s.evidence) for s in segment_response(response)]
