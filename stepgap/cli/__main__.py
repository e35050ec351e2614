"""`python -m stepgap.cli`: the same as the `stepgap` console script."""

from stepgap.cli import console

console()
