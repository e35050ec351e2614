"""The offline bundle: export, then load it in a fresh process with the network blocked and no
API key, and get the verdicts the in-memory checker gives; tampering is caught by file name."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepgap.cli import main
from stepgap.export.bundle import BundleError, export_bundle, verify_bundle
from stepgap.student.judge import StudentJudge
from stepgap.teacher import Checker, load_nli
from stepgap.teacher.judges.hf import StudentJudgeOptions
from stepgap.teacher.nli.onnx import ONNXNLIOptions

REPO = Path(__file__).resolve().parents[2]

# Runs in the fresh process: any socket that is not loopback fails the run.
GUARD = textwrap.dedent(
    """
    import socket, sys
    _connect = socket.socket.connect
    def _guarded(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and host not in ("127.0.0.1", "::1", "localhost"):
            raise RuntimeError(f"network access attempted: {address}")
        return _connect(self, address)
    socket.socket.connect = _guarded
    _cc = socket.create_connection
    def _guarded_cc(address, *a, **k):
        if address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise RuntimeError(f"network access attempted: {address}")
        return _cc(address, *a, **k)
    socket.create_connection = _guarded_cc
    """
)

LOAD = GUARD + textwrap.dedent(
    """
    import json, os
    assert not any(k.endswith("API_KEY") for k in os.environ), "an API key leaked in"
    from stepgap.segment import iter_traces
    from stepgap.export import OfflineChecker
    checker = OfflineChecker.from_bundle(sys.argv[1])
    traces = list(iter_traces(sys.argv[2]))
    with open(sys.argv[3], "w") as out:
        for verdicts in checker.check(traces):
            for v in verdicts:
                out.write(v.model_dump_json() + "\\n")
    """
)


def _fresh_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith(("API_KEY", "TOKEN"))}
    env["HF_HUB_OFFLINE"] = "0"  # the bundle must switch itself offline
    return env


@pytest.fixture(scope="module")
def bundles(tiny_student, tiny_nli, tmp_path_factory, examples_dir):
    adapter, _ = tiny_student
    root = tmp_path_factory.mktemp("bundles")
    probe = str(examples_dir / "teacher_verdicts.jsonl")
    assert main(["export", "--student", str(adapter), "--nli", str(tiny_nli), "-o",
                 str(root / "merged"), "--merge", "--nli-quantize", "int8",
                 "--probe-verdicts", probe]) == 0  # fmt: skip
    adapter_bundle = export_bundle(str(adapter), str(tiny_nli), root / "adapter")
    return {"merged": root / "merged", "adapter": adapter_bundle}


@pytest.fixture(scope="module")
def in_memory(tiny_student, tiny_nli, example_traces):
    adapter, _ = tiny_student
    checker = Checker(
        StudentJudge(str(adapter), StudentJudgeOptions(judge_batch_size=8)), load_nli(str(tiny_nli))
    )
    return [v for vs in checker.check(example_traces) for v in vs]


INT8_ATOL = 5e-2


def _same_verdicts(a, b, atol: float = 1e-5) -> None:
    """Same labels, paths, judge decisions and quotes, and NLI calls; NLI probabilities up to
    `atol` (ONNX fp32 vs PyTorch is float noise; the int8 graph moves most pairs of the trained
    stand-in by under 2e-3 and the odd pair by a few hundredths, measured up to 0.035).

    The reasoning strings, free text that the tiny student writes from near-random weights
    after its trained decisions, are equal on all steps but at most one: greedy decoding there
    meets near-ties that float summation order can flip, and CPU GEMM does not promise one
    order from run to run (a bundle run once in eight gave one other reasoning token)."""
    from stepgap.data_builders.student_target import judge_decisions

    assert len(a) == len(b)
    other_text = 0
    for x, y in zip(a, b, strict=True):
        assert (x.trace_id, x.step, x.label, x.path, x.error) == (
            y.trace_id, y.step, y.label, y.path, y.error,
        )  # fmt: skip
        assert (x.judge is None) == (y.judge is None)
        if x.judge is not None:
            assert judge_decisions(x.judge) == judge_decisions(y.judge), (x.trace_id, x.step)
            other_text += x.judge != y.judge
        assert [(c.premise, c.hypothesis) for c in x.nli] == [
            (c.premise, c.hypothesis) for c in y.nli
        ]
        for cx, cy in zip(x.nli, y.nli, strict=True):
            assert cx.probs.entailment == pytest.approx(cy.probs.entailment, abs=atol)
            assert cx.label == cy.label
    assert other_text <= 1, f"{other_text} steps with other reasoning text"


def test_manifest_lists_every_file_with_its_checksum(bundles):
    manifest = verify_bundle(bundles["merged"])
    files = {
        str(p.relative_to(bundles["merged"])) for p in bundles["merged"].rglob("*") if p.is_file()
    }
    assert set(manifest["files"]) == files - {"manifest.json"}
    assert "student/model.safetensors" in files and "nli/model_quantized.onnx" in files
    assert not any(f.endswith((".bin", ".pt", ".pkl")) for f in files)
    assert manifest["nli"]["parity"]["fp32_max_abs_logit_diff"] < 1e-3
    assert manifest["nli"]["parity"]["label_agreement_with_fp32"]["int8"] >= 0.99
    assert manifest["nli"]["parity"]["probe_pairs"] > 10  # the example pairs joined the probe
    counts = manifest["nli"]["parity"]["fp32_label_counts"]
    assert sum(n > 0 for n in counts.values()) == 3, counts  # int8 agrees on all three classes
    assert manifest["student"]["merged"] is True
    assert set(manifest) >= {"format_version", "stepgap_version", "prompt_version", "tree", "eval"}
    adapter = verify_bundle(bundles["adapter"])
    assert adapter["student"]["merged"] is False
    assert "student/adapter_model.safetensors" in adapter["files"]
    assert not any("checkpoint" in f or "tiny-base" in f for f in adapter["files"])


@pytest.mark.parametrize("kind", ["merged", "adapter"])
def test_fresh_offline_process_gives_the_in_memory_verdicts(
    bundles, kind, examples_dir, in_memory, tmp_path
):
    out = tmp_path / "verdicts.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", LOAD, str(bundles[kind]), str(examples_dir / "traces.jsonl"), str(out)],
        cwd=tmp_path, env=_fresh_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    from stepgap.schema import Verdict

    fresh = [Verdict.model_validate_json(x) for x in out.read_text().splitlines()]
    # merged: int8 NLI, which moves the trained stand-in's probabilities (see _same_verdicts);
    # the labels and NLI labels must still agree
    _same_verdicts(fresh, in_memory, atol=INT8_ATOL if kind == "merged" else 1e-5)
    assert sum(v.label is not None for v in fresh) >= 20


def test_the_network_guard_would_catch_a_connection(tmp_path):
    """The guard above is real: a non-loopback connection in that process fails."""
    code = GUARD + "import socket\nsocket.create_connection(('198.51.100.1', 443), timeout=1)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0 and "network access attempted" in proc.stderr


def test_cli_check_with_a_bundle(bundles, examples_dir, tmp_path, in_memory):
    from stepgap.io import read_models
    from stepgap.schema import Verdict

    out = tmp_path / "v.jsonl"
    assert main(["check", str(examples_dir / "traces.jsonl"), "--bundle", str(bundles["merged"]),
                 "-o", str(out), "--nli-precision", "fp32"]) == 0  # fmt: skip
    _same_verdicts([v for _, v in read_models(out, Verdict)], in_memory)
    assert main(["check", str(examples_dir / "traces.jsonl"), "--bundle", str(bundles["merged"]),
                 "--judge", "replay:x", "-o", str(out)]) == 2  # fmt: skip


@pytest.mark.parametrize(
    "victim", ["nli/model.onnx", "student/model.safetensors", "student/tokenizer.json"]
)
def test_a_tampered_file_fails_loading_naming_it(bundles, tmp_path, victim):
    copy = tmp_path / "bundle"
    shutil.copytree(bundles["merged"], copy)
    with (copy / victim).open("r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(BundleError, match=victim.replace(".", r"\.") + ".*sha256"):
        verify_bundle(copy)
    from stepgap.export import OfflineChecker

    with pytest.raises(BundleError, match=victim.split("/")[-1]):
        OfflineChecker.from_bundle(copy)
    assert main(["check", "x.jsonl", "--bundle", str(copy), "-o", str(tmp_path / "o")]) == 2


def test_missing_and_pickled_files_are_refused(bundles, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundles["merged"], copy)
    (copy / "student" / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(BundleError, match="pytorch_model.bin.*pickled"):
        verify_bundle(copy)
    (copy / "student" / "pytorch_model.bin").unlink()
    (copy / "nli" / "tokenizer.json").unlink()
    with pytest.raises(BundleError, match="tokenizer.json.*missing"):
        verify_bundle(copy)
    with pytest.raises(BundleError, match="not a stepgap bundle .*`stepgap export`"):
        verify_bundle(tmp_path)
    with pytest.raises(BundleError, match="absent: no such folder"):
        verify_bundle(tmp_path / "absent")


def test_export_refuses_to_overwrite_and_leaves_no_partial_bundle(bundles, tiny_student, tmp_path):
    adapter, _ = tiny_student
    with pytest.raises(FileExistsError):
        export_bundle(str(adapter), "unused", bundles["merged"])
    with pytest.raises(Exception):  # noqa: B017 - the NLI model does not exist
        export_bundle(str(adapter), str(tmp_path / "no-such-nli"), tmp_path / "b")
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".b.*"))
    assert json.loads((bundles["merged"] / "manifest.json").read_text())["format_version"] == 1


def test_nothing_in_a_bundle_or_its_card_names_a_path_of_this_machine(
    bundles, tmp_path_factory, tiny_nli
):
    """`push` publishes the manifest, the card and every file: hub ids and names only."""
    from stepgap.export.push import render_card

    local = str(tmp_path_factory.getbasetemp())
    for bundle in bundles.values():
        manifest = verify_bundle(bundle)
        texts = {"README.md": render_card(manifest, "me/x")}
        for p in bundle.rglob("*"):
            if p.is_file() and p.suffix in (".json", ".txt", ".jinja", ".md", ".yaml"):
                texts[str(p.relative_to(bundle))] = p.read_text(errors="replace")
        for name, text in texts.items():
            assert local not in text and str(REPO) not in text, name
        assert manifest["student"]["source"] == "tiny-student0"  # the folder's name
        assert manifest["nli"]["source"] == Path(tiny_nli).name  # tiny-nli0, or the cache's
    adapter = verify_bundle(bundles["adapter"])["student"]
    assert (
        adapter["base"] == "base"
        and "base/model.safetensors" in verify_bundle(bundles["adapter"])["files"]
    )


@pytest.mark.slow
def test_an_adapter_bundle_loads_after_its_source_folders_are_gone(
    tiny_student, tiny_nli, tmp_path, examples_dir, in_memory
):
    adapter, _ = tiny_student
    work = tmp_path / "work"
    shutil.copytree(
        adapter, work / "adapter", ignore=shutil.ignore_patterns("checkpoint-*", "tiny-base")
    )
    shutil.copytree(adapter / "tiny-base", work / "base")
    config = json.loads((work / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(work / "base")
    (work / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    export_bundle(str(work / "adapter"), str(tiny_nli), work / "bundle")
    shutil.move(work / "bundle", tmp_path / "elsewhere")
    shutil.rmtree(work)  # the adapter and its base are gone: the bundle must carry the base
    out = tmp_path / "verdicts.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", LOAD, str(tmp_path / "elsewhere"), str(examples_dir / "traces.jsonl"),
         str(out)], cwd=tmp_path, env=_fresh_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    from stepgap.schema import Verdict

    _same_verdicts(
        [Verdict.model_validate_json(x) for x in out.read_text().splitlines()], in_memory
    )


def test_a_hub_base_is_pinned_to_a_revision_or_refused(
    tiny_student, tiny_nli, tmp_path, hub_offline
):  # an empty cache: no revision to read
    adapter, _ = tiny_student
    copy = tmp_path / "adapter"
    shutil.copytree(adapter, copy, ignore=shutil.ignore_patterns("checkpoint-*", "tiny-base"))
    config = json.loads((copy / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "Qwen/Qwen2.5-0.5B-Instruct"
    (copy / "adapter_config.json").write_text(json.dumps(config))
    from stepgap.export import ExportError

    with pytest.raises(ExportError, match="--base-revision COMMIT"):
        export_bundle(str(copy), str(tiny_nli), tmp_path / "b1")
    assert not (tmp_path / "b1").exists() and not list(tmp_path.glob(".b1.*"))
    export_bundle(
        str(copy),
        str(tiny_nli),
        tmp_path / "b2",
        base_revision="7ae557604adf67be50417f59c2c2f167def9a775",
    )
    student = verify_bundle(tmp_path / "b2")["student"]
    assert student["base"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert student["base_revision"] == "7ae557604adf67be50417f59c2c2f167def9a775"
    shipped = json.loads((tmp_path / "b2" / "student" / "adapter_config.json").read_text())
    assert shipped["base_model_name_or_path"] == "Qwen/Qwen2.5-0.5B-Instruct"


def test_an_adapter_naming_its_base_relatively_exports_from_any_folder(
    tiny_nli, tmp_path, monkeypatch, hub_offline
):
    """An adapter trained in another folder names its base `student/tiny-base`: exported from
    here, the base is found above the adapter, copied in (adapter bundle) or merged into."""
    from tests.fixtures.models import build_tiny_adapter

    adapter = build_tiny_adapter(tmp_path / "project" / "student", "student/tiny-base")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    export_bundle(str(adapter), str(tiny_nli), tmp_path / "adapter")
    student = verify_bundle(tmp_path / "adapter")["student"]
    assert (student["base"], student["base_source"]) == ("base", "tiny-base")
    assert "base/model.safetensors" in verify_bundle(tmp_path / "adapter")["files"]
    export_bundle(str(adapter), str(tiny_nli), tmp_path / "merged", merge=True)
    assert verify_bundle(tmp_path / "merged")["student"]["merged"]


@pytest.fixture(scope="module")
def student_answers(tiny_student, example_traces) -> dict[str, dict]:
    """Prompt key -> what the tiny student itself answers to that step's prompt: a server
    replaying them stands for the student served by an inference engine."""
    from stepgap.teacher.prompt import build_requests
    from tests.fixtures.openai_server import prompt_key

    adapter, _ = tiny_student
    requests = [r for t in example_traces for r in build_requests(t.id, t.question, t.steps)]
    results = StudentJudge(str(adapter), StudentJudgeOptions(judge_batch_size=8)).judge(requests)
    answers = {
        prompt_key(q.messages): {**r.judge.model_dump(), **r.extra}
        for q, r in zip(requests, results, strict=True)
        if r.judge is not None
    }
    assert len(answers) >= 20
    return answers


def test_a_bundle_with_its_student_served_elsewhere(bundles, student_answers, in_memory, tmp_path,
                                                     examples_dir, example_traces, capsys):  # fmt: skip
    """`check --bundle B --judge openai:NAME --base-url URL`: the student answers from an
    OpenAI-compatible server (here the test server, replaying what the student itself answers
    to each prompt), asked with the student's schema; the bundle's ONNX NLI and thresholds
    decide, so the verdicts are the in-process ones."""
    from tests.fixtures.openai_server import FakeOpenAI, counted_by

    answers = student_answers
    student = bundles["merged"] / "student"

    def check_served(out, tokens_per_word: int = 0) -> tuple[int, FakeOpenAI]:
        """`check` against the student served by a server counting prompt tokens with the
        student's tokenizer, or `tokens_per_word` a word: its exit status and the server."""
        counted = counted_by(student, tokens_per_word)
        server = FakeOpenAI(answers=answers, prompt_tokens=counted).start()
        try:
            return main(["check", str(examples_dir / "traces.jsonl"), "--bundle",
                         str(bundles["merged"]), "--judge", "openai:stepgap-student", "--base-url",
                         server.base_url, "--no-cache", "--no-progress", "-o", str(out)]), server  # fmt: skip
        finally:
            server.stop()

    out = tmp_path / "served.jsonl"
    status, server = check_served(out)
    assert status == 0
    # a server that tokenizes otherwise (vLLM's own tokenizer of a qwen2 folder, for this
    # student's compact vocabulary) answers other prompts: refused at its first answer, with
    # what to serve instead, and nothing written
    wrong = tmp_path / "wrong.jsonl"
    status, other = check_served(wrong, tokens_per_word=4)
    assert status == 2
    err = capsys.readouterr().err
    assert f"the server at {other.base_url} counts " in err
    assert "Serve the bundle's own tokenizer (vLLM: --tokenizer ./student" in err
    assert not wrong.exists()
    from stepgap.io import read_models
    from stepgap.schema import Verdict

    served = [v for _, v in read_models(out, Verdict)]
    answered = [v for v in in_memory if v.judge is not None]
    assert len(answered) == len(answers)
    by_key = {(v.trace_id, v.step): v for v in served}
    _same_verdicts([by_key[(v.trace_id, v.step)] for v in answered], answered, atol=INT8_ATOL)
    # the bundle says how to serve its student, under the name used here
    manifest = verify_bundle(bundles["merged"])
    recipe = (bundles["merged"] / manifest["serving"]["recipe"]).read_text()
    assert manifest["files"]["SERVING.md"]  # checksummed like every file
    for line in ("vllm serve ./student --served-model-name stepgap-student",
                 "--model-path ./student --served-model-name stepgap-student",
                 "--bundle . --judge openai:stepgap-student --base-url"):  # fmt: skip
        assert line in recipe, line
    # the tiny student's vocabulary is its own: llama.cpp's converter would refuse it, and the
    # recipe says so instead of giving its command (tests/export/test_serving_recipe.py)
    assert "llama.cpp cannot take this student: `convert_hf_to_gguf.py`" in recipe
    assert 'convert_hf_to_gguf.py" ./student' not in recipe
    adapter_recipe = (bundles["adapter"] / "SERVING.md").read_text()
    assert ("--enable-lora --lora-modules stepgap-student=./student --max-lora-rank 64 "
            "--tokenizer ./student --port 8000") in adapter_recipe  # fmt: skip
    assert "--lora-paths stepgap-student=./student --tokenizer-path ./student" in adapter_recipe
    assert "llama.cpp cannot take this student, merged or not" in adapter_recipe
    schema = server.response_formats[0]["json_schema"]["schema"]
    assert {"pipeline_path", "gap_type"} <= set(schema["properties"])  # the student's schema
    assert served[0].checker["judge"]["spec"] == "openai:stepgap-student"


def test_a_bundle_takes_only_a_served_openai_judge(bundles, capsys):
    rc = main(["check", "examples/traces.jsonl", "--bundle", str(bundles["merged"]), "--judge",
               "hf:some/model", "-o", "x.jsonl"])  # fmt: skip
    assert rc == 2
    assert "with --bundle, --judge can only be openai:NAME" in capsys.readouterr().err


def _rechecksum(bundle: Path, rel: str) -> None:
    """Record `rel`'s new sha256 in the manifest: only its content differs, no checksum does."""
    from stepgap.export.bundle import sha256_file

    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"][rel] = sha256_file(bundle / rel)
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2))


def test_the_parity_probe_is_rerun_on_the_serving_provider(bundles, tmp_path):
    """Loading re-runs the recorded probe pairs on the chosen provider and precision: a good
    bundle loads on CPUExecutionProvider; one whose recorded PyTorch probabilities no longer
    match (one pair's label moved, re-checksummed) fails naming provider, precision and pair."""
    from stepgap.export import OfflineChecker

    manifest = verify_bundle(bundles["merged"])
    parity = manifest["nli"]["parity"]
    assert parity["reference"] in manifest["files"] and parity["atol"] == 1e-3
    reference = json.loads((bundles["merged"] / parity["reference"]).read_text())
    assert len(reference["pairs"]) == len(reference["probs"]) == parity["probe_pairs"]

    good = OfflineChecker.from_bundle(
        bundles["merged"], nli_options=ONNXNLIOptions(nli_provider=["CPUExecutionProvider"])
    )
    assert good.nli_parity is not None
    assert (good.nli_parity["provider"], good.nli_parity["precision"]) == (
        "CPUExecutionProvider", "int8",
    )  # fmt: skip
    assert good.nli_parity["label_agreement"] >= parity["floor"]

    copy = tmp_path / "bundle"
    shutil.copytree(bundles["merged"], copy)
    reference["probs"][1] = reference["probs"][1][1:] + reference["probs"][1][:1]
    (copy / parity["reference"]).write_text(json.dumps(reference))
    _rechecksum(copy, parity["reference"])
    verify_bundle(copy)  # every checksum holds: only the parity differs
    hypothesis = re.escape(reference["pairs"][1][1])
    with pytest.raises(BundleError, match=rf"int8 on CPUExecutionProvider.*{hypothesis}"):
        OfflineChecker.from_bundle(
            copy, nli_options=ONNXNLIOptions(nli_provider=["CPUExecutionProvider"])
        )
    with pytest.raises(BundleError, match=rf"fp32 on CPUExecutionProvider.*atol.*{hypothesis}"):
        OfflineChecker.from_bundle(copy, nli_options=ONNXNLIOptions(nli_precision="fp32"))


def test_an_unavailable_provider_is_named_with_those_available(bundles, examples_dir, capsys):
    """The CPU onnxruntime here: CUDA asked for on `check` and `serve` is exit 2 and one line
    listing the available providers, not ORT's silent fall-back to the CPU."""
    traces = str(examples_dir / "traces.jsonl")
    bundle = str(bundles["merged"])
    assert main(["check", traces, "--bundle", bundle, "-o", "unused.jsonl",
                 "--nli-provider", "CUDAExecutionProvider", "--nli-provider", "cpu"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "CUDAExecutionProvider is not available" in err and "CPUExecutionProvider" in err, err
    assert main(["serve", "--bundle", bundle, "--nli-provider", "cuda:device_id=0,cpu"]) == 2
    assert "CUDAExecutionProvider is not available" in capsys.readouterr().err
    assert main(["check", traces, "--judge", "replay:x", "--nli", "replay:y", "-o", "unused.jsonl",
                 "--nli-provider", "cpu"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "option nli_provider (--nli-provider) does not apply to the NLI model replay:y" in err


def test_the_nli_device_places_a_bundles_onnx_model(bundles, examples_dir, tmp_path, capsys):
    """`--device` (the NLI device) reaches a bundle's ONNX model as the provider of that device,
    where it used to be dropped: `cpu` runs, `cuda` on this CPU build is the unavailable
    provider's one line, a device ONNX Runtime cannot place is named, and `--device` beside
    `--nli-provider` is refused. An `onnx:` NLI model takes the same flags."""
    from stepgap.export import OfflineChecker

    traces = str(examples_dir / "traces.jsonl")
    bundle = str(bundles["merged"])
    on_cpu = OfflineChecker.from_bundle(bundle, nli_options=ONNXNLIOptions(device="cpu"))
    assert on_cpu.nli.session.get_providers() == ["CPUExecutionProvider"]
    out = tmp_path / "v.jsonl"
    assert main(["check", traces, "--bundle", bundle, "--device", "cpu", "-o", str(out)]) == 0
    assert len(out.read_text().splitlines()) > 0
    for device, message in (
        ("cuda", "CUDAExecutionProvider is not available"),
        ("cuda:1", "CUDAExecutionProvider is not available"),
        ("mps", "device 'mps': an ONNX NLI model runs on cpu, cuda or cuda:N"),
    ):
        assert main(["check", traces, "--bundle", bundle, "--device", device,
                     "-o", str(tmp_path / "no.jsonl")]) == 2  # fmt: skip
        assert message in capsys.readouterr().err
    assert main(["check", traces, "--bundle", bundle, "--device", "cpu", "--nli-provider", "cpu",
                 "-o", str(tmp_path / "no.jsonl")]) == 2  # fmt: skip
    assert "a device or providers, not both" in capsys.readouterr().err
    assert not (tmp_path / "no.jsonl").exists()

    onnx = f"onnx:{bundles['merged'] / 'nli'}"
    replay = str(examples_dir / "judge_replay.jsonl")
    for flags in (["--device", "cpu"], ["--nli-provider", "cpu"]):
        out = tmp_path / f"onnx{flags[0]}.jsonl"
        assert main(["check", traces, "--judge", f"replay:{replay}", "--nli", onnx,
                     *flags, "-o", str(out)]) == 0, capsys.readouterr()  # fmt: skip


def test_verls_reward_loop_asks_the_student_behind_its_reward_router(
    bundles, student_answers, tiny_qwen2, example_traces, tmp_path
):
    """veRL's reward loop with the bundle's student as its reward model: veRL's own
    `RewardLoopWorker` (custom reward function `serving/verl.py`) gets the address of veRL's own
    `NaiveRouter`, in front of a server that answers as the student does. Stages A-C go through
    the router with the student's schema; the rewards are the in-process bundle's."""
    import asyncio

    from tests.fixtures.peers import import_peer

    import_peer("verl")
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.experimental.reward_loop.router.naive_router import NaiveRouter

    from stepgap.export import OfflineChecker
    from stepgap.serving import StepGapReward, process_reward
    from tests.fixtures.live_server import LiveServer
    from tests.fixtures.openai_server import FakeOpenAI, counted_by
    from tests.serving.test_interop_verl import batch

    student = bundles["merged"] / "student"
    reward_json = tmp_path / "reward.json"
    reward_json.write_text(json.dumps({"bundle": str(bundles["merged"]), "no_cache": True}))
    config = OmegaConf.create({
        "actor_rollout_ref": {"model": {"path": str(tiny_qwen2), "tokenizer_path": None}},
        "reward": {
            "custom_reward_function": {
                "path": str(REPO / "serving" / "verl.py"), "name": "compute_score",
                "reward_kwargs": {"config": str(reward_json)},
            },
            "reward_manager": {"source": "register", "name": "naive", "module": None},
            "reward_model": {"enable": True, "model_path": str(student),
                             "rollout": {"name": "vllm"}},
            "reward_kwargs": {},
            "sandbox_fusion": None,
        },
    })  # fmt: skip
    server = FakeOpenAI(answers=student_answers, prompt_tokens=counted_by(student)).start()
    process_reward.reset()
    try:
        with LiveServer(NaiveRouter([server.base_url.removesuffix("/v1")]).app) as router:
            worker = RewardLoopWorker(config, router.removeprefix("http://"))
            data = batch(example_traces, AutoTokenizer.from_pretrained(tiny_qwen2))

            async def score_all():
                return await asyncio.gather(
                    *(worker.compute_score(data[i : i + 1]) for i in range(len(data)))
                )

            outs = worker.loop.run_until_complete(score_all())
    finally:
        server.stop()
        process_reward.reset()
    expected = StepGapReward(OfflineChecker.from_bundle(bundles["merged"])).score_traces(
        example_traces
    )
    got = [out["reward_score"] for out in outs]
    assert got == pytest.approx([r.reward for r in expected])
    schema = server.response_formats[0]["json_schema"]["schema"]
    assert {"pipeline_path", "gap_type"} <= set(schema["properties"])  # the student's schema
    assert len(server.answered()) >= 20  # stages A-C went to the served student
