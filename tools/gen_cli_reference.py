"""Writes docs/cli.md, the command-line reference: each command's `--help` as the command's own
parser makes it, so the page says what `--help` says; and docs/judges/index.md, the list of
stepgap's own judges as their registry finds them, each with its page (docs/judges/KIND.md,
written by hand: a judge without one is an error here) and its flags.

    python tools/gen_cli_reference.py          # rewrite docs/cli.md and docs/judges/index.md
    python tools/gen_cli_reference.py --check  # exit 1 if either is not what it would write

`tests/test_docs.py` runs the check, so a changed option fails the suite until the page is
written again. argparse's layout differs a little between Python versions, and `train` prints
the help of transformers' and TRL's own arguments: the page records the versions that wrote it,
and the check compares only under those.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
JUDGES_PAGE = PAGE.parent / "judges" / "index.md"

INTRO = """# Command line

`stepgap COMMAND --help` prints each of these. Every command takes `--config FILE.yaml` (its
options as keys: `batch_size: 16` or `batch-size: 16`; flags on the command line win; relative
paths in the file are read from the working directory, as on the command line) and
`--print-config` (the resolved options as YAML that `--config` reads back, nothing run). A
mistake in a file is one line naming the file, the line and the key.

The options of the judges and NLI models are the fields of their own options classes, the same
names in Python, in a `--config` file and in a reward worker's JSON file ([Python
API](python-api.md), [serving](serving.md)). Exit statuses are listed at the end.

"""


def versions() -> str:
    """What the page's text depends on beside this checkout: Python (argparse's layout),
    transformers and TRL (the training options' help)."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("transformers", "trl"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"no {name}")
    return ", ".join([f"Python {sys.version_info.major}.{sys.version_info.minor}", *found])


def header() -> str:
    return f"<!-- written by tools/gen_cli_reference.py under {versions()}: do not edit; run it again -->\n"


def page() -> str:
    """The page's text, from the parsers of this checkout."""
    os.environ["COLUMNS"] = "100"  # argparse wraps help at the terminal's width: one width here
    from stepgap.cli import build_parser, commands

    parts = [header(), INTRO]
    for name, command in commands().items():
        text = command.make_parser().format_help()
        parts.append(f"## `stepgap {name}`\n\n{command.help}\n\n```text\n{text.rstrip()}\n```\n\n")
    top = build_parser().format_help()
    parts.append(f"## `stepgap`\n\n```text\n{textwrap.dedent(top).rstrip()}\n```\n")
    return "".join(parts)


JUDGES_HEADER = "<!-- written by tools/gen_cli_reference.py: do not edit; run it again -->\n"
JUDGES_INTRO = """# Judges

The judge of stages A-C is `--judge KIND:ARG` ([Python API](../python-api.md): `build_judge`).
Here are stepgap's own: each judge module of `teacher/judges`, and the student's, which
`stepgap.student` adds; a plug-in package adds its own under the entry-point group
`stepgap.judges` ([Development](../development.md#adding-a-judge)). Each page says how a judge
is used and what its options do. An option is a field of the judge's options class: a flag of
`stepgap check`, `label`, `serve` and `baseline`, a key of their `--config` files and of a
reward worker's JSON file, a keyword of `build_judge` ([Command line](../cli.md)).

| judge | its page | its options |
|---|---|---|
"""


def judges_page() -> str:
    """The judges' index, from their registry: a row per judge, its page's title and its
    flags; a judge with no page is an error that names the page to write."""
    import stepgap.student.judge  # noqa: F401 - registers the student's judge
    from stepgap.registry import flag, resolve
    from stepgap.teacher.judges import JUDGES

    rows = []
    for kind, entry in sorted(JUDGES.own().items()):
        page = JUDGES_PAGE.parent / f"{kind}.md"
        if not page.exists():
            raise SystemExit(f"the judge {kind!r} has no page: write {page}")
        title = page.read_text().split("\n", 1)[0].removeprefix("# ").strip()
        names = resolve(entry).options_class.names()
        flags = ", ".join(f"`{flag(n)}`" for n in names) or "none"
        rows.append(f"| `{kind}:` | [{title}]({kind}.md) | {flags} |\n")
    return JUDGES_HEADER + JUDGES_INTRO + "".join(rows)


def written_under(text: str) -> str | None:
    """The versions a page was written under (`versions()`), from its first line."""
    first = text.split("\n", 1)[0]
    marker = "under "
    return first.split(marker, 1)[1].split(":", 1)[0] if marker in first else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    pages = {PAGE: page(), JUDGES_PAGE: judges_page()}
    if args.check:
        stale = [path for path, text in pages.items() if path.read_text() != text]
        for path in stale:
            print(f"{path} is out of date: run python tools/gen_cli_reference.py", file=sys.stderr)
        return 1 if stale else 0
    for path, text in pages.items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
