"""Check the layer contracts of pyproject.toml ([tool.importlinter]) with import-linter.

The folders users asked for (teacher/, eval/, ...) are mapped under `stepgap.` by
`[tool.setuptools] package-dir`; an editable install resolves them with an import hook that
import-linter's graph builder cannot follow. So this lays the sources out as a wheel installs them
(a copy of the .py files in a temporary folder) and lints that copy.

    python tools/lint_imports.py            # exit 0 when every contract is kept
    python tools/lint_imports.py --show     # also the import-linter report when they are
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]


def installed_layout(dest: Path, repo: Path = REPO) -> Path:
    """Copy every Python module of the package into `dest/stepgap/...`, as installed."""
    config = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = config["tool"]["setuptools"]
    mapping = setuptools.get("package-dir", {})
    for package in setuptools["packages"]:
        source = repo / mapping.get(package, package.replace(".", "/"))
        target = dest / package.replace(".", "/")
        target.mkdir(parents=True, exist_ok=True)
        for module in source.glob("*.py"):
            shutil.copy2(module, target / module.name)
    return dest


def lint(layout: Path, repo: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run import-linter with the repository's contracts over an installed layout."""
    env = {**os.environ, "PYTHONPATH": str(layout)}
    return subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
         "lint_imports_command()", str(repo / "pyproject.toml"), "--no-cache"],
        cwd=layout, env=env, capture_output=True, text=True,
    )  # fmt: skip


_MUTUAL = (
    "import grimp; g = grimp.build_graph('stepgap', cache_dir=None)\n"
    "for a in sorted(g.modules):\n"
    "    for b in sorted(g.find_modules_directly_imported_by(a)):\n"
    "        if a < b and a in g.find_modules_directly_imported_by(b): print(a, '<->', b)\n"
)


def mutual_imports(layout: Path) -> list[str]:
    """Pairs of modules that import each other (at any depth of the code, type-only imports
    included): a circle the layers cannot see, inside one folder."""
    env = {**os.environ, "PYTHONPATH": str(layout)}
    done = subprocess.run([sys.executable, "-c", _MUTUAL], cwd=layout, env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.splitlines()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--show", action="store_true", help="print the report also when kept")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("importlinter") is None:
        print(
            "lint_imports: import-linter is not installed: pip install -e '.[dev]'", file=sys.stderr
        )
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        layout = installed_layout(Path(tmp))
        result = lint(layout)
        circles = mutual_imports(layout)
    if result.returncode or args.show:
        print(result.stdout + result.stderr, end="")
    print("layer contracts:", "kept" if result.returncode == 0 else "BROKEN", file=sys.stderr)
    for pair in circles:
        print(f"modules that import each other: {pair}", file=sys.stderr)
    return result.returncode or (1 if circles else 0)


if __name__ == "__main__":
    sys.exit(main())
