"""`python -m stepgap.cli`: the same as the `stepgap` console script."""

import sys

from stepgap.cli import main

sys.exit(main())
