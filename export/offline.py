"""The offline checker: a bundle in, verdicts out; no API key, no network.

`OfflineChecker.from_bundle` takes a bundle's folder or its Hub id (`USER/NAME[@REVISION]`,
fetched once into the Hugging Face cache: `pull.py`), verifies every checksum, switches the Hub
client offline, loads
the ONNX NLI model on the chosen execution providers and re-runs the bundle's parity probe there,
loads the student (safetensors only, no remote code), and runs them through the same decision
tree as the teacher with the thresholds recorded at export.

A PRM's bundle (`student.kind` "prm") gives a `BundledPRMChecker` instead: the PRM's ONNX graph
on ONNX Runtime, its parity probe re-run there, no judge, no NLI model and no tree.

`load_checker` is what the command line and a reward worker build from a `CheckerConfig`: a
bundle's offline checker, or the hybrid checker of its judge and NLI specs (`build_checker`),
with the student's `student:PATH` judge among the specs.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

# importing the student's judge registers `student:PATH` among the judges load_checker builds
from stepgap.student.judge import ServedStudentJudge, StudentJudge, student_meta
from stepgap.student.prm import ONNXPRM, PRM_KIND, PRMChecker, PRMFormat
from stepgap.teacher.build import CheckerConfig
from stepgap.teacher.checker import Checker, StepChecker
from stepgap.teacher.judges import JudgeBackend
from stepgap.teacher.judges.hf import StudentJudgeOptions
from stepgap.teacher.judges.model_judge import with_cache_and_meter
from stepgap.teacher.judges.openai_api import OpenAIJudge, OpenAIJudgeOptions
from stepgap.teacher.nli.onnx import ONNXNLI, ONNXNLIOptions, parse_providers
from stepgap.tree import TreeConfig

from .bundle import GENERATIVE, MANIFEST, Bundle, BundleError, read_bundle
from .onnx_nli import ParityError, served_parity
from .onnx_prm import served_prm_parity
from .pull import BundleSource, locate_bundle

log = logging.getLogger(__name__)


def go_offline() -> None:
    """Make every Hugging Face load local-only, also for libraries imported already."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import huggingface_hub.constants as constants

        constants.HF_HUB_OFFLINE = True
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        pass


class OfflineChecker(Checker):
    """The hybrid checker of an exported bundle: its student as the judge, its ONNX NLI model
    and the thresholds it recorded."""

    manifest: dict[str, Any]
    # the bundle's parity probe as re-run at load: provider, precision, figures
    nli_parity: dict[str, Any] | None
    # a bundle loaded by Hub id: its id, the revision asked and the commit loaded
    origin: dict[str, Any] | None = None

    @classmethod
    def from_bundle(
        cls,
        path: str | Path | Bundle,
        judge_options: StudentJudgeOptions | None = None,
        nli_options: ONNXNLIOptions | None = None,
        *,
        online: bool = False,
        served_judge: Callable[[Bundle], JudgeBackend] | None = None,
    ) -> StepChecker:
        """`judge_options`: the student's (its device, dtype, batch, answer budget, engine;
        `student_base` moves the base the bundle names); it keeps no answer cache. `online`:
        the student on vLLM's async engine, for a server. `nli_options`: which ONNX graph
        (`nli_precision`, default the bundle's) on which ONNX Runtime execution providers
        (`nli_provider`, in order of preference, e.g. `["CUDAExecutionProvider",
        "CPUExecutionProvider"]`; default CUDA when available, then CPU), or on `device`. The
        bundle's probe pairs are re-run on the provider and precision that will serve before
        the student loads: probabilities off the recorded PyTorch ones raise BundleError.
        `served_judge(bundle)`: the bundle's student as served elsewhere (an OpenAI-compatible
        engine: `served_student`), used instead of loading the student here. `path` is the
        bundle's folder, or its Hub id (`USER/NAME[@REVISION]`; a folder of that name wins), or
        a `Bundle` opened already.

        A PRM's bundle gives a `BundledPRMChecker` (`bundle_prm`): `nli_options` then choose
        its ONNX graph and providers, and a judge option or `served_judge` is an error."""
        bundle = path if isinstance(path, Bundle) else open_bundle(path)
        if bundle.is_prm:
            if judge_options is not None or served_judge is not None or online:
                raise ValueError(
                    f"{bundle.root}: a PRM bundle has no judge; judge options do not apply to it"
                )
            return bundle_prm(bundle, nli_options)
        nli, served = bundle_nli(bundle, nli_options)
        judge: JudgeBackend
        if served_judge is not None:
            judge = served_judge(bundle)
        else:
            judge = StudentJudge(
                str(bundle.student_dir),
                student_options(bundle, judge_options),
                base_revision=bundle.student_base_revision,
                online=online,
            )
        checker = cls(judge, nli, TreeConfig(**bundle.tree))
        checker.manifest = bundle.manifest
        checker.nli_parity = served
        checker.origin = bundle.origin
        return checker

    @classmethod
    def from_pretrained(
        cls, id_or_path: str | Path, *, revision: str | None = None, **options: Any
    ) -> StepChecker:
        """`from_bundle` by a Hub id and a revision, as transformers loads a model:
        `OfflineChecker.from_pretrained("user/name", revision="v1")` (a folder of that name
        wins, and its revision is not asked). `options` are `from_bundle`'s."""
        local = Path(id_or_path).exists()
        ref = f"{id_or_path}@{revision}" if revision and not local else id_or_path
        return cls.from_bundle(ref, **options)

    @property
    def provenance(self) -> dict[str, object]:
        """The judge's and NLI model's, and for a bundle from the Hub, the commit it came from."""
        models = super().provenance
        return models if self.origin is None else {**models, "bundle": self.origin}


class BundledPRMChecker(PRMChecker):
    """A PRM bundle's checker: its ONNX PRM, with the manifest, the parity probe as re-run at
    load, and for a bundle from the Hub, the commit it came from (in every verdict)."""

    manifest: dict[str, Any]
    prm_parity: dict[str, Any]
    origin: dict[str, Any] | None = None

    @property
    def provenance(self) -> dict[str, object]:
        models = super().provenance
        return models if self.origin is None else {**models, "bundle": self.origin}


def bundle_prm(bundle: Bundle, options: ONNXNLIOptions | None = None) -> BundledPRMChecker:
    """A PRM bundle's checker on the graph (`nli_precision`, default the bundle's) and ONNX
    Runtime providers (`nli_provider`) `options` ask for, after its parity probe is re-run
    there: probabilities off the recorded PyTorch ones raise BundleError."""
    from stepgap.models import load_tokenizer

    options = options or ONNXNLIOptions()
    if options.device is not None:
        raise ValueError("--device does not apply to a PRM bundle: choose --nli-provider")
    precisions = bundle.manifest["student"]["precisions"]
    precision = options.nli_precision or bundle.student_precision or "fp32"
    if precision not in precisions:
        raise BundleError(
            f"{bundle.root}: the PRM bundle has {', '.join(precisions)} graphs, not {precision}"
        )
    runner = ONNXPRM(bundle.student_dir, precision, parse_providers(options.nli_provider))
    checker = BundledPRMChecker(
        runner, load_tokenizer(str(bundle.student_dir)), PRMFormat.read(bundle.student_dir)
    )
    try:
        checker.prm_parity = served_prm_parity(
            runner,
            checker.encoder,
            bundle.parity_reference or {},
            atol=bundle.parity_atol,
            floor=bundle.parity_floor,
        )
    except (ParityError, KeyError) as exc:
        raise BundleError(f"{bundle.root}: {exc}") from None
    log.info("%s: PRM parity holds on %s (%s)", bundle.root, runner.provider, precision)
    checker.manifest = bundle.manifest
    checker.origin = bundle.origin
    return checker


def open_bundle(path: str | Path) -> Bundle:
    """A bundle (a folder, or a Hub id fetched into the cache first), every checksum verified,
    with the Hub client switched offline."""
    return _opened(locate_bundle(path))


def _opened(source: BundleSource) -> Bundle:
    go_offline()
    return replace(read_bundle(source.path), origin=source.provenance())


def located(ref: str | Path) -> str | Path | Bundle:
    """A bundle fetched from the Hub, or a PRM's, opened (every checksum verified); a local
    generative bundle's folder as it is, for `from_bundle` to open once its options are read.
    Its manifest's `student.kind` is peeked at first, unverified: verifying comes next."""
    source = locate_bundle(ref)
    try:
        manifest = json.loads((source.path / MANIFEST).read_text(encoding="utf-8"))
        kind = manifest["student"].get("kind", GENERATIVE)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        kind = GENERATIVE  # read_bundle names what is wrong with it
    return _opened(source) if kind == PRM_KIND or source.repo_id else ref


def student_options(bundle: Bundle, options: StudentJudgeOptions | None) -> StudentJudgeOptions:
    """The options of a bundle's student: those given, on the base the bundle names unless
    they name another."""
    options = options or StudentJudgeOptions()
    return options if options.student_base else replace(options, student_base=bundle.student_base)


def bundle_nli(
    bundle: Bundle, options: ONNXNLIOptions | None = None
) -> tuple[ONNXNLI, dict[str, Any] | None]:
    """The bundle's ONNX NLI model on the graph and providers `options` ask for, and its
    parity probe as re-run there (None for a bundle that records none): probabilities off the
    recorded PyTorch ones raise BundleError."""
    if bundle.nli_dir is None:
        raise ValueError(f"{bundle.root}: a PRM bundle has no NLI model (nor a judge student)")
    options = options or ONNXNLIOptions()
    nli = ONNXNLI(
        bundle.nli_dir,
        precision=options.nli_precision or bundle.nli_precision,
        providers=parse_providers(options.nli_provider),
        device=options.device,
    )
    return nli, parity_on(bundle, nli)


def parity_on(bundle: Bundle, nli: ONNXNLI) -> dict[str, Any] | None:
    """The bundle's parity probe re-run on the NLI model as it will serve (None for a bundle
    that records none, with a warning); probabilities off the recorded ones raise BundleError."""
    if bundle.parity_reference is None:
        log.warning(
            "%s: the bundle records no parity reference (exported by an older stepgap), so "
            "the NLI model is not checked on %s; re-export to check it",
            bundle.root,
            nli.provider,
        )
        return None
    try:
        served = served_parity(
            nli, bundle.parity_reference, atol=bundle.parity_atol, floor=bundle.parity_floor
        )
    except ParityError as exc:
        raise BundleError(f"{bundle.root}: {exc}") from None
    log.info("%s: NLI parity holds on %s (%s)", bundle.root, nli.provider, nli.precision)
    return served


def served_student(bundle: Bundle, name: str, options: OpenAIJudgeOptions) -> JudgeBackend:
    """The bundle's student served by an OpenAI-compatible engine under model `name` (`--bundle
    B --judge openai:NAME`), prompted as it was trained (NLI features, evidence budget, target)
    and its tokens checked against the student's own tokenizer where the bundle ships one (an
    adapter may leave it to its base). `options` are the openai judge's."""
    meta = student_meta(bundle.student_dir)
    shipped = (bundle.student_dir / "tokenizer_config.json").is_file()
    return with_cache_and_meter(
        functools.partial(
            ServedStudentJudge,
            nli_features=bool(meta.get("nli_features", False)),
            earlier_evidence_chars=meta.get("earlier_evidence_chars"),
            target=meta.get("target") or "full",  # the schema it was trained to write
            tokenizer=str(bundle.student_dir) if shipped else None,
        ),
        name,
        options,
    )


# What a PRM bundle's configuration may set: which ONNX graph, on which providers.
PRM_OPTIONS = ("bundle", "nli_precision", "nli_provider")


def load_checker(config: CheckerConfig, *, online: bool = False) -> StepChecker:
    """The checker `config` describes: the offline checker of its bundle, or else the hybrid
    checker of its judge and NLI specs (`CheckerConfig.build`); `online`: for a server (a local
    judge on vLLM runs its async engine). With a bundle, `judge="openai:NAME"` asks the bundle's
    student served by an OpenAI-compatible engine at `base_url` instead of loading it here; the
    bundle still gives the schema, prompt version, NLI model and thresholds. The other judge
    options go to the bundle's student (`StudentJudgeOptions`); one it does not take is an
    error naming its flag. A PRM's bundle takes `nli_precision` and `nli_provider` (its ONNX
    graph's) and nothing else: any other option set is an error naming its flag."""
    if not config.bundle:
        return config.build(online=online)
    if config.nli:
        raise ValueError("--bundle brings its own model; drop --nli")
    bundle = located(config.bundle)
    if isinstance(bundle, Bundle) and bundle.is_prm:
        from stepgap.registry import flag

        for name in config.changed():
            if name not in PRM_OPTIONS:
                raise ValueError(
                    f"option {name} ({flag(name)}) does not apply to the PRM of --bundle "
                    f"{config.bundle}: it has no judge, NLI model or tree; it takes "
                    "--nli-precision and --nli-provider (its ONNX graph's)"
                )
        return bundle_prm(
            bundle, config.nli_options(ONNXNLI, f"the PRM of --bundle {config.bundle}")
        )  # type: ignore[arg-type]
    what = f"the judge of --bundle {config.bundle}"
    nli_options = config.nli_options(ONNXNLI, f"the NLI model of --bundle {config.bundle}")
    if config.judge is None:
        if config.cache or config.prices:
            raise ValueError(
                f"--cache and --prices do not apply to {what}: it keeps no answer cache"
            )
        options = config.judge_options(StudentJudge, what)
        return OfflineChecker.from_bundle(
            bundle,
            options,
            nli_options,
            online=online,  # type: ignore[arg-type]
        )
    kind, _, name = config.judge.partition(":")
    if kind != "openai" or not name:
        raise ValueError(
            "with --bundle, --judge can only be openai:NAME: the bundle's student served "
            "by an OpenAI-compatible engine (vLLM, SGLang, llama.cpp) at --base-url"
        )
    options = config.judge_options(OpenAIJudge, f"the judge {config.judge}")
    return OfflineChecker.from_bundle(
        bundle,
        nli_options=nli_options,  # type: ignore[arg-type]
        served_judge=functools.partial(served_student, name=name, options=options),
    )
