"""A checker from spec strings: what `--judge` and `--nli` mean, for the command line and for
Python users alike (a notebook, a veRL worker, a sweep script).

`CheckerConfig` is the checker's configuration as data: the specs, the options of the judges
and NLI models stepgap ships (each backend's own options class: those of every judge module in
`teacher/judges`, as the judges' registry finds them, `ONNXNLIOptions` with the NLI model's) and
the tree's thresholds (`TreeConfig`), all as fields of one flat dataclass. Its field names are
the flags of `stepgap check`, `label` and `serve`, the keys of their `--config` files and of a
reward worker's JSON file: a new judge's options reach all of them from its own module. A
bundle is loaded a layer up, beside the bundle it reads (`stepgap.export.offline.load_checker`),
where the command line and the reward choose between the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepgap.options import Options, bases_of, option
from stepgap.registry import options_for
from stepgap.tree import TreeConfig

from .checker import Checker
from .judges import JUDGE_GROUP, JUDGES, JudgeBackend, build_judge
from .nli import NLI_BACKENDS, NLI_GROUP, NLIBackend, load_nli
from .nli.onnx import ONNXNLIOptions

BUNDLE_GROUP = "offline bundle"
# Keys a configuration file may not hold, with the way to do it instead.
REFUSED_KEYS = {
    "api_key": "an API key is never read from a file: name the environment variable that holds "
    "it with api_key_env (default OPENAI_API_KEY)",
}
# The options classes of the judges and NLI models whose fields `CheckerConfig` holds: the
# judges' from their modules (`Registry.options_classes`), in the order of their kinds.
JUDGE_OPTIONS = JUDGES.options_classes()
NLI_OPTIONS = (ONNXNLIOptions,)


@dataclass(frozen=True)
class CheckerSpecs(Options):
    """What names a checker: a judge and an NLI model, or a bundle."""

    judge: str | None = option(
        None,
        "openai:MODEL (any OpenAI-compatible server), hf:PATH_OR_ID (local causal LM, also a "
        ".gguf file), student:PATH (trained adapter or merged student) or replay:FILE",
        metavar="SPEC",
        group=JUDGE_GROUP,
    )
    nli: str | None = option(
        None,
        "replay:FILE, hf:ID_OR_PATH, onnx:EXPORTED_FOLDER or a hub id/path",
        metavar="SPEC",
        group=NLI_GROUP,
    )
    bundle: str | None = option(
        None,
        "offline checker exported by `stepgap export` (no --judge/--nli, no API key): its "
        "folder, or its Hub id USER/NAME[@REVISION] after `stepgap push`",
        metavar="DIR_OR_ID",
        group=BUNDLE_GROUP,
    )

    def require_specs(self) -> None:
        """A ValueError unless this names a checker: a judge and an NLI model, or a bundle."""
        if not self.bundle and not (self.judge and self.nli):
            raise ValueError("give --judge and --nli, or --bundle")


# A base's fields come after those of the bases listed after it: the judges' in reverse, so that
# `--help` shows them in the order of their kinds. Two declaring one name differently: an error.
CHECKER_BASES = bases_of(*reversed(JUDGE_OPTIONS), *NLI_OPTIONS, TreeConfig, CheckerSpecs)


@dataclass(frozen=True)
class CheckerConfig(*CHECKER_BASES):  # type: ignore[misc]
    """What a checker is built from, as data: `CheckerConfig(judge="openai:gpt-4.1-mini",
    nli="MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli", base_url=..., entail_threshold=0.6)`.

    Each judge and NLI model takes the fields of its own options class; a field set (not at its
    default) that the chosen backend does not take is an error naming its flag. No field holds
    a secret: the API key is read from the variable `api_key_env` names."""

    @property
    def tree(self) -> TreeConfig:
        """The tree's thresholds and ablation, as a verdict records them."""
        return TreeConfig.take(self)

    def judge_options(self, backend: type[JudgeBackend], what: str) -> Options:
        """The options of judge class `backend` (`what` names it in errors), from these fields."""
        return options_for(self, backend, JUDGE_OPTIONS, what)

    def nli_options(self, backend: type[NLIBackend], what: str) -> Options:
        """The options of NLI class `backend` (`what` names it in errors), from these fields."""
        return options_for(self, backend, NLI_OPTIONS, what)

    def build(self, *, online: bool = False) -> Checker:
        """The hybrid checker of `judge` and `nli`; `online`: for a server (a local judge on
        vLLM runs its async engine, fed request by request). A configuration naming a bundle
        is loaded by `stepgap.export.offline.load_checker`, which also takes one that names
        specs."""
        if self.bundle:
            raise ValueError(
                f"bundle={self.bundle!r}: a bundle is loaded by "
                "stepgap.export.offline.load_checker(config)"
            )
        self.require_specs()
        assert self.judge is not None and self.nli is not None
        judge_options = self.judge_options(JUDGES.backend_of(self.judge), f"the judge {self.judge}")
        nli_options = self.nli_options(
            NLI_BACKENDS.backend_of(self.nli), f"the NLI model {self.nli}"
        )
        judge = build_judge(self.judge, judge_options, online=online)
        return Checker(judge, load_nli(self.nli, nli_options), self.tree)


def build_checker(
    judge: str | JudgeBackend | None = None,
    nli: str | NLIBackend | None = None,
    *,
    tree: TreeConfig | None = None,
    judge_options: Options | dict[str, Any] | None = None,
    nli_options: Options | dict[str, Any] | None = None,
) -> Checker:
    """The hybrid checker from a judge and an NLI model (specs or backends): `build_judge(judge,
    judge_options)` and `load_nli(nli, nli_options)` for specs. An exported bundle's offline
    checker is `stepgap.export.offline.OfflineChecker.from_bundle`; `CheckerConfig.build` is
    the same from one flat configuration."""
    if not (judge and nli):
        raise ValueError("give --judge and --nli, or --bundle")
    judge_backend = build_judge(judge, judge_options) if isinstance(judge, str) else judge
    nli_backend = load_nli(nli, nli_options) if isinstance(nli, str) else nli
    return Checker(judge_backend, nli_backend, tree)  # type: ignore[arg-type]
