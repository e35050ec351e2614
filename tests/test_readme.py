"""The README's Python API section runs as written, block by block, in one fresh interpreter.

The blocks build on each other (segment -> check -> label -> eval -> reward -> distil ->
export), so they run in order in one namespace, from a folder that holds the repository's
`examples/`. The one change: the DeBERTa hub id becomes the tiny local NLI model (no network).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HUB_NLI = "MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli"

RUNNER = """
import contextlib, io, json, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__readme__"}
printed = []
for i, code in enumerate(blocks):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"README block {i + 1}", "exec"), namespace)
    except Exception:
        traceback.print_exc()
        sys.exit(f"README Python API block {i + 1} failed")
    printed.append(out.getvalue())
json.dump(printed, open(sys.argv[2], "w"))
print("ALL BLOCKS RAN")
"""


def api_blocks(readme: str) -> list[str]:
    section = readme.split("## Python API", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def block_printing(blocks: list[str], call: str) -> int:
    """The index of the one block that contains `call` (what it prints is checked)."""
    (index,) = [i for i, b in enumerate(blocks) if call in b]
    return index


@pytest.mark.slow
def test_every_python_api_example_runs_and_prints_what_it_says(tmp_path, tiny_nli):
    from collections import Counter

    from stepgap.segment import iter_traces

    blocks = api_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 7
    blocks = [b.replace(HUB_NLI, str(tiny_nli)) for b in blocks]
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "run.py").write_text(RUNNER)
    done = subprocess.run(
        [sys.executable, "run.py", "blocks.json", "printed.json"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "ALL BLOCKS RAN" in done.stdout
    assert "every step check failed" not in done.stderr, done.stderr[-4000:]
    out = tmp_path / "out"
    for written in ("segmented.jsonl", "verdicts.jsonl", "minus_E.jsonl", "report/report.md",
                    "rewards.jsonl", "sft/stepgap_sft.json", "student/adapter_model.safetensors",
                    "mined/summary.json", "bundle/manifest.json"):  # fmt: skip
        assert (out / written).exists(), written
    assert len((out / "verdicts.jsonl").read_text().splitlines()) == 28

    printed = json.loads((tmp_path / "printed.json").read_text())
    at = lambda call: printed[block_printing(blocks, call)].splitlines()  # noqa: E731
    first = next(iter(iter_traces(REPO / "examples" / "traces.jsonl")))
    assert at("segment_file(") == [first.steps[0].claim]
    lines = at("for verdicts in checker.check(traces)")  # trace, step, label, repair, path
    assert len(lines) == 28
    assert Counter(line.split()[2] for line in lines) == {"no_gap": 21, "CC": 3, "IE": 2, "MB": 2}
    assert "verdicts=28" in at("label_file(")[0]
    report = json.loads((out / "report" / "report.json").read_text())
    sf1, files = at("evaluate(")[0].split(" ", 1)
    assert float(sf1) == pytest.approx(report["checkers"]["StepGap"]["sF1"])
    assert "report.json" in files and "report.md" in files
    assert at("reward.score_traces(") == ["1.4"]  # case 1: EM 1 + 1.0 x (0.20 + 0.20)
    assert at("inline.finalize(") == ["1.4 1"]  # the same reward, one step left at the end
    assert at("write_view(") == ["out/view.html 10 28"]
    training, agreement, short_circuit = at("mine(")[-1].split(" ", 2)  # after the Trainer logs
    trained_on = json.loads((out / "student" / "stepgap_student.json").read_text())
    assert int(training) == len(trained_on["train_trace_ids"])  # all left out of the pool
    offline = at("export_bundle(")
    assert len(offline) == 2 and offline[0].startswith("[RewardResult(")
    assert "manifest.json" in offline[1] and "README.md" in offline[1]


def test_every_python_block_of_the_readme_is_python():
    """Every ```python block can be pasted as it is: no `...` placeholders in calls, no
    pseudo-code (the ones outside the API section are not run: they need models or clusters)."""
    import ast
    import textwrap

    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert len(blocks) > len(api_blocks(readme))
    for block in blocks:
        tree = ast.parse(textwrap.dedent(block))  # a SyntaxError names the line
        for node in ast.walk(tree):  # `f(model=...)`: parses, but is no program
            if isinstance(node, ast.Call):
                args = [*node.args, *(k.value for k in node.keywords)]
                assert not any(isinstance(a, ast.Constant) and a.value is Ellipsis for a in args), (
                    ast.unparse(node)
                )


def test_the_view_walkthrough_runs_as_written_and_writes_only_where_git_ignores(tmp_path):
    """The `stepgap view` section's commands, pasted as written (without the browser): they
    succeed, and everything they write is under `out/`, which the repository's .gitignore
    covers, so a reader's clone stays clean."""
    import shlex

    readme = (REPO / "README.md").read_text()
    section = readme.split("## Look at the verdicts", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    commands = [shlex.split(c, comments=True) for c in block.replace("\\\n", " ").splitlines()]
    commands = [c for c in commands if c and c[0] == "stepgap"]
    assert len(commands) == 4
    (tmp_path / "examples").symlink_to(REPO / "examples")
    stepgap = str(Path(sys.executable).parent / "stepgap")
    for command in commands:
        done = subprocess.run([stepgap, *command[1:]], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, (command, done.stderr)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()
                     and "examples" not in p.parts)  # fmt: skip
    assert written == ["out/r.jsonl", "out/v.jsonl", "out/v_minus_E.jsonl", "out/view.html"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=REPO,
                             capture_output=True, text=True)  # fmt: skip
    assert ignored.stdout.split() == written, ignored.stderr
