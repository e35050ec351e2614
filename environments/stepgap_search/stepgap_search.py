"""`stepgap-search`, the name verifiers 0.4 knows stepgap's search environment by.

verifiers imports a taskset id as a top-level module (`vf-eval stepgap-search` imports
`stepgap_search`) and takes the `Taskset`, `Harness` and `Env` its `__all__` exports: this module
re-exports them from `stepgap.serving.verifiers_env`, where they are written and documented.
"""

from stepgap.serving import verifiers_env
from stepgap.serving.verifiers_env import *  # noqa: F403

__all__ = list(verifiers_env.__all__)
