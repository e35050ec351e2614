"""Writes the site's command-line reference (cli.md) as the site builds (mkdocs-gen-files): each
command's `--help`, made by the command's own parser, so the page cannot drift from it."""

from __future__ import annotations

import os
import textwrap

import mkdocs_gen_files

from stepgap.cli import build_parser, commands

os.environ["COLUMNS"] = "100"  # argparse wraps help at the terminal's width: one width here

INTRO = """# Command line

`stepgap COMMAND --help` prints each of these. Every command takes `--config FILE.yaml` (its
options as keys: `batch_size: 16` or `batch-size: 16`; flags on the command line win) and
`--print-config` (the resolved options as YAML that `--config` reads back, nothing run). A
mistake in a file is one line naming the file, the line and the key.

The options of the judges and NLI models are the fields of their own options classes, the same
names in Python, in a `--config` file and in a reward worker's JSON file ([Python
API](python-api.md), [serving](serving.md)). Exit statuses are listed at the end.

"""


def section(name: str) -> str:
    command = commands()[name]
    text = command.make_parser().format_help()
    return f"## `stepgap {name}`\n\n{command.help}\n\n```text\n{text.rstrip()}\n```\n\n"


with mkdocs_gen_files.open("cli.md", "w") as out:
    out.write(INTRO)
    for name in commands():
        out.write(section(name))
    top = build_parser().format_help()
    out.write(f"## `stepgap`\n\n```text\n{textwrap.dedent(top).rstrip()}\n```\n")
