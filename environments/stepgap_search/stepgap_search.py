"""`stepgap-search`, the name verifiers 0.4 knows stepgap's search environment by.

verifiers imports a taskset id as a top-level module (`vf-eval stepgap-search` imports
`stepgap_search`) and takes the `Taskset`, `Harness` and `Env` its `__all__` exports: this module
re-exports them from `stepgap.serving.verifiers_env`, where they are written and documented.
"""

from stepgap.serving.verifiers_env import (
    StepgapSearchConfig,
    StepgapSearchData,
    StepgapSearchEnv,
    StepgapSearchEnvConfig,
    StepgapSearchHarness,
    StepgapSearchHarnessConfig,
    StepgapSearchTask,
    StepgapSearchTaskConfig,
    StepgapSearchTaskset,
    load_environment,
)

__all__ = [
    "StepgapSearchConfig",
    "StepgapSearchData",
    "StepgapSearchEnv",
    "StepgapSearchEnvConfig",
    "StepgapSearchHarness",
    "StepgapSearchHarnessConfig",
    "StepgapSearchTask",
    "StepgapSearchTaskConfig",
    "StepgapSearchTaskset",
    "load_environment",
]
