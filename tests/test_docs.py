"""The documentation runs as written: the Python API page block by block in one fresh
interpreter (segment -> check -> label -> eval -> reward -> distil -> export, each building on
the one before, from a folder that holds the repository's `examples/` and `tests/`, offline);
the view walkthrough's commands; every Python block of the README and the pages parses; the
site builds strictly; the README stays a front page."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"

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


def api_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page, flags=re.S)


def block_printing(blocks: list[str], call: str) -> int:
    """The index of the one block that contains `call` (what it prints is checked)."""
    (index,) = [i for i, b in enumerate(blocks) if call in b]
    return index


@pytest.mark.slow
def test_every_python_api_example_runs_as_written_and_prints_what_it_says(tmp_path, tiny_nli):
    """As written, offline: where a real run takes a model from the Hub, the page's block
    builds the tests' stand-in itself (here it finds the session's, copied where it looks)."""
    import shutil
    from collections import Counter

    from stepgap.segment import iter_traces

    blocks = api_blocks((DOCS / "python-api.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 9
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "tests").symlink_to(REPO / "tests")
    shutil.copytree(tiny_nli, tmp_path / "out" / "standin-nli")
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


def test_every_python_block_of_the_readme_and_the_docs_is_python():
    """Every ```python block can be pasted as it is: no `...` placeholders in calls, no
    pseudo-code (the ones outside the Python API page are not run: they need models or
    clusters)."""
    import ast
    import textwrap

    pages = [REPO / "README.md", *DOCS.rglob("*.md")]
    blocks = [b for p in pages for b in re.findall(r"```python\n(.*?)```", p.read_text(), re.S)]
    assert len(blocks) > len(api_blocks((DOCS / "python-api.md").read_text()))
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

    page = (DOCS / "evaluation.md").read_text()
    section = page.split("## Look at the verdicts", 1)[1]
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


def test_the_readme_is_a_front_page():
    """What it is, install, a quickstart and links, in at most 300 lines; no dated figure or
    load average (measured figures live in BENCHMARKS.md with their dates)."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", readme)
    assert "load average" not in readme and "nice -n" not in readme
    for heading in ("## Install", "## Quickstart", "## Documentation"):
        assert heading in readme
    for link in re.findall(r"\]\(([^)#]+)[^)]*\)", readme):  # every file it links is there
        if not link.startswith("http"):
            assert (REPO / link).exists(), link


def test_the_command_line_page_is_what_the_parsers_say():
    """docs/cli.md is each command's `--help`: a changed option fails here until
    `python tools/gen_cli_reference.py` writes the page again (compared under the Python,
    transformers and TRL that wrote it: argparse's layout and the training options' help
    differ between their versions)."""
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import gen_cli_reference as gen
    finally:
        sys.path.pop(0)
    written = (REPO / "docs" / "cli.md").read_text()
    if gen.written_under(written) != gen.versions():
        pytest.skip(f"docs/cli.md was written under {gen.written_under(written)}, not here")
    assert written == gen.page(), (
        "docs/cli.md is out of date: run python tools/gen_cli_reference.py"
    )
    from stepgap.cli import commands

    for name in commands():
        assert f"## `stepgap {name}`" in written, name


def test_the_site_builds_strictly_offline(tmp_path):
    """`make docs`: a broken link, a missing page or an unknown anchor fails the build; the
    pages are files, so the site browses from disk."""
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI must build the docs site: mkdocs comes with stepgap[docs]")
        pytest.skip("mkdocs is not installed (pip install 'stepgap[docs]')")
    env = {
        **os.environ,
        "DISABLE_MKDOCS_2_WARNING": "true",
        "NO_MKDOCS_2_WARNING": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    index = (tmp_path / "site" / "index.html").read_text()
    assert 'href="cli.html"' in index and 'href="getting-started.html"' in index
    assert "stepgap serve" in (tmp_path / "site" / "cli.html").read_text()


def test_every_cell_of_the_trainers_table_names_a_test_that_exists():
    """docs/rl/index.md: each trainer's row has a cell per column, and each test a cell names
    (`FILE::NAME`, or `::NAME` after a FILE in the same cell) is a test function of that file."""
    import re

    rows = [line for line in (DOCS / "rl" / "index.md").read_text().splitlines()
            if line.startswith("| [")]  # fmt: skip
    assert len(rows) == 7, rows
    named = 0
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 6 and all(cells), row
        for cell in cells[1:]:
            file = None
            for ref_file, name in re.findall(r"`(test_\w+\.py)?::(test_\w+)`", cell):
                file = ref_file or file
                assert file, cell
                source = (REPO / "tests" / "serving" / file).read_text()
                assert f"def {name}(" in source, f"{file}::{name}"
                named += 1
    assert named >= 28
