"""bench/gpu_suite.py: the GPU suite runs on the CPU with --tiny (the same code as the 7B run),
every section ends with figures, the reason it cannot run here, or its error (never an error
counted as a skip), and the wheels it carries to the device stay installable."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures.bench import bench_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_suite.py"


def _suite():
    return bench_script("gpu_suite")


@pytest.mark.slow
def test_tiny_suite_runs_every_section_on_the_cpu(tmp_path):
    import torch

    out, kept = tmp_path / "suite.json", tmp_path / "work"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--out", str(out), "--keep", str(kept)],
        cwd=REPO,
        check=True,
        timeout=900,
    )
    report = json.loads(out.read_text())
    sections = report["sections"]
    assert list(sections) == ["judge", "sft", "qlora", "onnx_nli", "prm"]
    # a section that crashed is "error" (and the suite exits 1: check=True above fails first);
    # on a CPU only QLoRA may be skipped, and only for want of CUDA
    for name, section in sections.items():
        assert section["status"] in {"ok", "skipped"}, (name, section.get("why"))
        assert section["status"] == "ok" or name == "qlora", (name, section)
        assert section["seconds"] >= 0
    assert report["setup"]["status"] == "ok", report["setup"].get("error")
    assert report["machine"]["torch"] == torch.__version__
    # --keep: the model stays for more runs on it, with the judge bench's report
    assert (kept / "base" / "config.json").is_file() and list((kept / "judge").glob("*.json"))

    judge = sections["judge"]["result"]  # bench/judge_throughput.py's report
    assert judge["complete"] is True
    assert set(judge["runs"]) == {"plain_b2", "hf", "hf_copied", "cb"}
    # the judge folds its heads here: hf_copied is the HF path on transformers' own attention
    assert judge["runs"]["hf_copied"]["steps"] == 6
    assert judge["hf_copied_vs_hf"] > 0 and "hf_copied" not in judge  # no note: it ran
    # one full batch by memory (64 rows on a CPU) for the HF path: all 6 steps here
    assert judge["hf_path_steps"] == judge["runs"]["hf"]["steps"] == 6
    assert judge["runs"]["hf"]["batch_size"] == "auto"
    assert judge["runs"]["plain_b2"]["steps"] == judge["hf_steps"] == 2
    assert judge["runs"]["hf"]["judges_equal_best_plain"].endswith("/2")  # on the shared steps
    assert len(judge["judge_objects"]["hf"]) == 6 and "cb" not in judge["judge_objects"]
    step = judge["model_step"]  # the model alone, for the runs' steps to be read against
    assert step["batch"] == 2 and step["step_ms"] > 0 and step["step_padded_ms"] > 0
    assert step["step_padded_copied_heads_ms"] > 0 and step["step_padded_grouped_heads_ms"] > 0
    assert step["step_padded_ms"] == step["step_padded_grouped_heads_ms"]  # the judge's, on a CPU
    assert step["launch_ms"] > 0 and set(step["step_ms_by_batch"]) == {"1"}  # 2x batch: GPU only
    assert step["step_ms_by_batch"]["1"] > 0
    assert judge["cb"] == "ran" and judge["runs"]["cb"]["judges_equal_best_plain"] == "n/a"
    assert all(r["answer_tokens_per_s"] > 0 for r in judge["runs"].values())
    assert judge["cb_tokens_vs_best_plain"] > 0
    profiled = judge["profile"]  # where the HF path's generate() spends its time
    assert profiled["requests"] == 2 and profiled["wall_s"] > 0
    assert profiled["top_self_cpu"] and all(op["ms"] >= 0 for op in profiled["top_self_cpu"])

    sft = sections["sft"]
    assert sft["status"] == "ok", sft.get("error")
    assert sft["plain_trl"]["tokens_per_s"] > 0 and sft["project"]["tokens_per_s"] > 0
    assert sft["plain_trl"]["recipe"] == {"packing": False, "padding_free": False}
    assert sft["project"]["recipe"]["packing"] and sft["project"]["recipe"]["padding_free"]
    # the recipe's attention key reached the model the project's train() built
    assert sft["project"]["attn_implementation"] == sft["project"]["recipe"]["attn_implementation"]
    assert sft["ratio"] == pytest.approx(
        sft["project"]["tokens_per_s"] / sft["plain_trl"]["tokens_per_s"], rel=1e-3
    )
    assert 100 <= sft["lengths"]["min"] and sft["lengths"]["max"] <= sft["max_length"]

    nli = sections["onnx_nli"]
    assert nli["status"] == "ok", nli.get("error")
    assert nli["provider"] == "CPUExecutionProvider"
    assert set(nli["pairs_per_s"]) == {"pytorch_fp32", "onnx_fp32"}
    assert all(v > 0 for v in nli["pairs_per_s"].values())
    prm = sections["prm"]  # the PRM's labelled steps/s, every step of its traces labelled
    assert prm["status"] == "ok", prm.get("error")
    assert set(prm["steps_per_s"]) == {"pytorch_float32", "onnx_fp32"}
    assert all(v > 0 for v in prm["steps_per_s"].values())
    assert prm["labelled"] == dict.fromkeys(prm["steps_per_s"], prm["steps"])
    if not torch.cuda.is_available():
        assert "CUDA" in sections["qlora"]["skipped"]


def test_the_cb_run_stops_at_its_deadline_and_leaves_the_model_as_it_was(tmp_path):
    """The judge section's time budget: a cb run past its deadline stops inside the engine
    (no hang on its pending requests) and hands the model back for a later run."""
    from stepgap.teacher.judges.decoding import GROUPED_SDPA
    from stepgap.teacher.judges.hf import HFJudge, HFJudgeOptions
    from tests.fixtures.models import build_qwen2

    bench = _judge_bench()
    judge = HFJudge(
        str(build_qwen2(tmp_path / "m", hidden=128)), HFJudgeOptions(engine="hf", max_tokens=8)
    )
    attention = _attention_set(judge.model)
    requests = bench.workload(str(REPO / "examples" / "traces.jsonl"), 3)
    with pytest.raises(RuntimeError, match="no token came back before the deadline"):
        bench.continuous_batching(judge, requests, 8, deadline=time.perf_counter())
    assert "sdpa" in attention and attention[-1] == GROUPED_SDPA  # the judge's, after it
    assert not hasattr(judge.model, "_cached_continuous_batching_manager")
    row = bench.continuous_batching(judge, requests, 8)  # no deadline: every request ends
    assert row["steps"] == 3 and row["answer_tokens_per_step"] == 8.0
    assert "cut_at_deadline" not in row


def test_model_step_times_both_attentions_and_reports_grouped_heads_that_fail(
    tmp_path, monkeypatch
):
    """`model_step` times a padded decode step with transformers' SDPA and with grouped heads,
    on the judge's model as it was after; where grouped heads cannot run (a device's kernels),
    it says why and keeps the other figures, so a GPU run is not lost to it."""
    import stepgap.teacher.judges.decoding as decoding
    from stepgap.teacher.judges.hf import HFJudge, HFJudgeOptions
    from tests.fixtures.models import build_qwen2

    bench = _judge_bench()
    judge = HFJudge(str(build_qwen2(tmp_path / "m")), HFJudgeOptions(engine="hf", max_tokens=8))
    attention = _attention_set(judge.model)
    step = bench.model_step(judge.model, batch=2, context=16, steps=2)
    assert step["attention"] == decoding.GROUPED_SDPA == attention[-1]  # as it was, after
    assert step["step_padded_copied_heads_ms"] > 0 and step["step_padded_grouped_heads_ms"] > 0
    assert step["step_padded_ms"] == step["step_padded_grouped_heads_ms"]
    monkeypatch.setattr(decoding, "attend_grouped", lambda model, devices=None: False)
    judge.model.set_attn_implementation("sdpa")  # as a judge without grouped heads runs
    step = bench.model_step(judge.model, batch=2, context=16, steps=2)
    assert step["attention"] == "sdpa"
    assert step["step_padded_grouped_heads_ms"] is None and "cannot" in step["grouped_heads_error"]
    assert step["step_padded_ms"] == step["step_padded_copied_heads_ms"] > 0
    assert attention[-1] == "sdpa"
    report = {
        "model": "m", "device": "cuda:0", "dtype": "torch.bfloat16", "steps": 2, "hf_steps": 2,
        "prompt_tokens_mean": 16, "load_s": {}, "best_plain": None, "runs": {}, "cb": "ran",
        "vllm": "ran", "model_step": step, **dict.fromkeys((
            "hf_vs_best_plain", "vllm_vs_best_plain", "vllm_vs_hf", "vllm_vs_served",
            "cb_tokens_vs_best_plain", "cb_tokens_vs_hf",
        )),
    }  # fmt: skip
    assert "cannot attend with grouped heads) with grouped heads" in bench.table(report)


def _judge_bench():
    return bench_script("judge_throughput")


def _attention_set(model) -> list[str]:
    """The attention implementations `model` is set to from now on, in order: the last is the
    one it attends with (transformers has no public getter for it)."""
    names: list[str] = []
    real = model.set_attn_implementation

    def recorded(name, *args, **kwargs):
        real(name, *args, **kwargs)
        names.append(name)

    model.set_attn_implementation = recorded
    return names


def test_a_plain_run_out_of_memory_is_said_and_the_hf_path_still_runs(tmp_path, monkeypatch):
    """A plain `generate` batch too big for the GPU (an 80 GB card at 256 rows, say) is named in
    the report, and the HF path's run, which the section exists for, still happens; `auto` is
    the HF path's batch by memory, at most the transformers runs' steps."""
    import torch

    bench = _judge_bench()

    def plain(judge, requests, batch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(bench, "plain", plain)
    monkeypatch.setattr(sys, "argv", [
        "judge_throughput.py", "--tiny", "--steps", "4", "--hf-steps", "2", "--batches",
        "auto,1", "--model-step-batch", "0", "--max-new-tokens", "8", "--max-string-chars", "8",
        "--no-vllm", "--out", str(tmp_path),
    ])  # fmt: skip
    bench.main()
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert report["plain_out_of_memory"] == ["plain_b2", "plain_b1"]
    assert report["best_plain"] is None and report["runs"]["hf"]["steps"] == 2
    assert report["complete"] is True
    assert "out of memory: plain_b2, plain_b1" in bench.table(report)
    line = _suite().headline("judge", {"status": "ok", "result": report})
    assert line.startswith("no plain generate figure (plain_b2, plain_b1 out of memory)")


@pytest.mark.parametrize(
    ("device", "inside"),
    [
        ("cuda", ["stepgap_grouped_sdpa", "sdpa"]),  # a user's generate(): transformers' SDPA
        ("cpu", []),  # the judge's grouped heads, as the CPU tables ran
    ],
)
def test_plain_generate_runs_in_request_order_as_a_users_does_on_a_cuda_gpu(
    device, inside, monkeypatch
):
    """Plain `generate` is the reference: the requests in their order, `batch` at a time, each
    row held to the judge's schema; on a CUDA GPU on transformers' own SDPA, and the judge's
    attention comes back after it; on a CPU on the judge's own."""
    import torch

    import stepgap.teacher.judges.decoding as decoding

    bench = _judge_bench()
    set_to: list[str] = []
    model = SimpleNamespace(device=torch.device(device), set_attn_implementation=set_to.append)
    calls = []

    def generate_answers(model, tokenizer, prompts, indexes, max_new_tokens):
        calls.append((list(set_to), prompts, indexes))
        return [decoding.Decoded([0], [0.0]) for _ in prompts]

    def result(decoded, prompt_tokens, answer):
        return SimpleNamespace(judge=None, usage={"completion_tokens": len(decoded.tokens)})

    monkeypatch.setattr(decoding, "generate_answers", generate_answers)
    judge = SimpleNamespace(
        model=model, tokenizer=None, max_new_tokens=8, answer_index=lambda answer: "schema",
        prompt_ids=lambda request: [request], answer_result=result,
    )  # fmt: skip
    row = bench.plain(judge, [3, 1, 2, 0, 4], batch=2)
    assert [prompts for _, prompts, _ in calls] == [[[3], [1]], [[2], [0]], [[4]]]
    assert all(indexes == ["schema"] * len(p) for _, p, indexes in calls)
    assert all(attention == inside for attention, _, _ in calls)
    assert set_to == inside + (["stepgap_grouped_sdpa"] if inside else [])  # the judge's after
    assert row["steps"] == 5 and row["batch_size"] == 2 and row["failed"] == 5


def test_without_plain_runs_nothing_is_called_best_plain_and_failed_answers_are_said():
    """--no-hf (vLLM beside a served engine): no ratio to a best plain run that did not run,
    judge objects compared with the fastest run that has them; and the suite's one line says
    when the timed answers failed (a random model cut at its token limit)."""
    bench = _judge_bench()
    verdict = SimpleNamespace(model_dump=lambda: {"claim_supported": True})  # a judge object
    answers = [SimpleNamespace(judge=verdict)] * 512
    vllm = bench.figures("vllm", 512, 40.0, 80000, None, 0, answers)
    served = bench.figures("served", 512, 80.0, 80000, None, 0, answers)
    context = {"model": "m", "device": "cpu", "dtype": "torch.float32", "steps": 512,
               "hf_steps": 512, "prompt_tokens_mean": 1000, "load_s": {}, "cb": "ran",
               "vllm": "ran"}  # fmt: skip
    report = bench.compose(context, {"vllm": vllm, "served": served})
    assert report["best_plain"] is None and report["vllm_vs_best_plain"] is None
    assert report["judges_compared_with"] == "vllm" and report["vllm_vs_served"] == 2.0
    assert report["runs"]["served"]["judges_equal_best_plain"] == "512/512"
    assert report["judge_objects"]["served"] == [{"claim_supported": True}] * 512
    lines = bench.table(report).splitlines()
    assert "512 distinct steps (no transformers runs)" in lines[0]
    assert lines[1].split()[-3:] == ["judges", "=", "vllm"]
    assert "best plain" not in lines[-1] and "vllm / served: 2.0x" in lines[-1]

    suite = _suite()
    plain = bench.figures("plain_b2", 2, 4.0, 64, 2, 2, None)
    hf = bench.figures("hf", 6, 3.0, 192, None, 6, None)
    cb = bench.figures("cb", 6, 2.0, 192, None, "n/a", None)
    judge = {"best_plain": "plain_b2", "hf_vs_best_plain": 4.0, "vllm_vs_best_plain": None,
             "runs": {"plain_b2": plain, "hf": hf, "cb": cb}}  # fmt: skip
    line = suite.headline("judge", {"status": "ok", "result": judge})
    assert (
        line == "HF path 4.0x best plain generate (plain_b2); 8 of 8 answers failed (timing only)"
    )
    hf["failed"] = 0
    plain["failed"] = 0
    assert "failed" not in suite.headline("judge", {"status": "ok", "result": judge})


def test_the_judge_table_shows_a_cb_run_cut_at_its_deadline():
    """A cut cb run has no tokens per step (its tokens include unfinished answers): the table
    shows a dash there instead of failing after the run (as it once did on a GPU)."""
    bench = _judge_bench()
    plain = bench.figures("plain_b24", 24, 34.86, 4867, 24, 0, None)
    cb = bench.figures("cb", 0, 23.8, 5400, None, "n/a", None)
    cb["answer_tokens_per_step"], cb["cut_at_deadline"] = None, "0 of 24 requests finished"
    runs = {"plain_b24": plain, "cb": cb}
    for row in runs.values():
        row.pop("_results")
    report = {
        "model": "m", "device": "cuda:0", "dtype": "torch.bfloat16", "steps": 512,
        "hf_steps": 24, "prompt_tokens_mean": 1032, "load_s": {"hf": 17.1},
        "best_plain": "plain_b24", "hf_vs_best_plain": None, "vllm_vs_best_plain": None,
        "vllm_vs_hf": None, "vllm_vs_served": None, "cb_tokens_vs_best_plain": 1.62,
        "cb_tokens_vs_hf": None, "cb": "cut at --deadline 150 s: 0 of 24 requests finished",
        "vllm": "vLLM is not installed here: no vLLM figure", "runs": runs,
    }  # fmt: skip
    lines = bench.table(report).splitlines()
    assert lines[2].split() == [
        "plain_b24",
        "24",
        "24",
        "34.86",
        "0.688",
        "139.6",
        "202.8",
        "0",
        "-",
    ]
    assert lines[3].split()[:7] == ["cb", "auto", "0", "23.8", "0.0", "226.9", "-"]
    assert "cb answer tokens/s / best plain: 1.62x" in lines[4]
    assert "cut at --deadline 150 s" in lines[4] and "vLLM is not installed" in lines[4]


def test_a_failing_section_is_an_error_with_its_traceback_and_fails_the_suite(
    monkeypatch, tmp_path
):
    suite = _suite()

    def broken(sizes, work):
        raise KeyError("no such tensor: lm_head.weight")

    def missing(sizes, work):
        raise suite.Skip("bitsandbytes is not installed")

    monkeypatch.setitem(suite.SECTION_RUNS, "sft", broken)
    monkeypatch.setitem(suite.SECTION_RUNS, "qlora", missing)
    failed = suite.run_section("sft", suite.TINY_SIZES, tmp_path)
    assert failed["status"] == "error" and "skipped" not in failed
    assert failed["why"] == "error: KeyError: 'no such tensor: lm_head.weight'"
    assert "Traceback" in failed["error"] and "broken" in failed["error"]
    skipped = suite.run_section("qlora", suite.TINY_SIZES, tmp_path)
    assert skipped == {"status": "skipped", "skipped": "skipped: bitsandbytes is not installed",
                       "seconds": skipped["seconds"]}  # fmt: skip
    # the suite's exit status: 1 when a section ended in error, after writing the JSON
    runs = {"setup": {"status": "ok", "parameters": 7e9, "size_gib": 14}, "sft": failed}
    others = {"status": "skipped", "skipped": "skipped: not run by this test"}
    monkeypatch.setattr(suite, "run_child", lambda name, *a: runs.get(name, others))
    monkeypatch.setattr(sys, "argv", ["gpu_suite.py", "--tiny", "--out", str(tmp_path / "s.json")])
    with pytest.raises(SystemExit) as exited:
        suite.main()
    assert exited.value.code == 1
    assert json.loads((tmp_path / "s.json").read_text())["sections"]["sft"]["status"] == "error"


def test_a_section_over_its_budget_is_killed_and_recorded(tmp_path):
    result = _suite().run_child("setup", tmp_path, tiny=True, budget=0.5)
    assert result == {
        "status": "error",
        "why": "error: over its budget of 0.5 s (killed)",
        "seconds": pytest.approx(0.5, abs=5),
    }


def test_a_judge_section_killed_at_its_budget_keeps_what_its_bench_wrote(tmp_path):
    """The judge bench writes its report after each run: a section killed at its budget (as
    one was on an H100) reports the runs that ended, not nothing."""
    written = {"complete": False, "model_step": {"step_ms": 104.2}, "runs": {"plain_b24": {}}}
    (tmp_path / "judge").mkdir()
    (tmp_path / "judge" / "judge_throughput-base-cuda.json").write_text(json.dumps(written))
    suite = _suite()
    result = suite.run_child("judge", tmp_path, tiny=True, budget=0.5)
    assert result["why"] == "error: over its budget of 0.5 s (killed)"
    assert result["partial"] == written
    # a section that ended "ok" or was skipped has no partial figures
    ok = {"status": "ok", "result": written}
    assert suite.with_partial("judge", tmp_path, dict(ok)) == ok
    assert "partial" not in suite.with_partial("sft", tmp_path, {"status": "error"})


def test_step_clock_times_tokens_after_the_warmup():
    clock = _suite().StepClock()
    clock.times = {0: 0.0, 1: 10.0, 2: 12.0, 3: 14.0}
    clock.tokens = {1: 1000.0, 2: 1800.0, 3: 2600.0}
    figures = clock.figures(warmup=1)
    assert figures["tokens"] == 1600 and figures["seconds"] == 4.0
    assert figures["tokens_per_s"] == 400.0 and figures["timed_steps"] == 2
    with pytest.raises(RuntimeError, match="warm-up"):
        clock.figures(warmup=3)


def test_slim_wheel_keeps_one_cuda_and_a_consistent_record(tmp_path):
    suite = _suite()
    wheel = tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
    libs = [
        "bitsandbytes/libbitsandbytes_cpu.so",
        "bitsandbytes/libbitsandbytes_cuda118.so",
        "bitsandbytes/libbitsandbytes_cuda128.so",
        "bitsandbytes/libbitsandbytes_cuda130.so",
        "bitsandbytes/libbitsandbytes_cuda132.so",
        "bitsandbytes/libbitsandbytes_rocm64.so",
    ]
    files = ["bitsandbytes/__init__.py", *libs]
    record = (
        "".join(f"{f},sha256=x,1\n" for f in files) + "bitsandbytes-0.50.2.dist-info/RECORD,,\n"
    )
    with zipfile.ZipFile(wheel, "w") as z:
        for f in files:
            z.writestr(f, b"x")
        z.writestr("bitsandbytes-0.50.2.dist-info/RECORD", record)
    assert suite.slim_wheel(wheel, suite._other_gpu_library(13)) == 3
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        kept = z.read("bitsandbytes-0.50.2.dist-info/RECORD").decode()
    expected = {
        "bitsandbytes/__init__.py",
        "bitsandbytes/libbitsandbytes_cpu.so",
        "bitsandbytes/libbitsandbytes_cuda130.so",
        "bitsandbytes/libbitsandbytes_cuda132.so",
    }
    assert names == expected | {"bitsandbytes-0.50.2.dist-info/RECORD"}
    assert {line.split(",")[0] for line in kept.splitlines()} == names


def _imported_distributions(*scripts: Path) -> set[str]:
    """The installed distributions that provide the top-level modules `scripts` import."""
    import ast
    import importlib.metadata

    providers = importlib.metadata.packages_distributions()
    names: set[str] = set()
    for script in scripts:
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    # the suite's own modules (some wheels, veRL's and OpenRLHF's, ship a top-level `tests` too)
    ours = {"stepgap", "tests", "nli_onnx"}
    dists = {d for name in names - sys.stdlib_module_names - ours for d in providers.get(name, [])}
    return {d.lower().replace("_", "-") for d in dists}


def test_the_carried_wheels_and_the_image_hold_everything_the_sections_need():
    """Every package the suite imports (and stepgap's own requirements, and what each requires,
    on the machine's Python 3.12) is in the GPU image or among the carried wheels, and every
    carried pin, and every image version known, is inside the ranges those packages set."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.version import Version

    suite = _suite()
    carried = {r.name: Version(str(r.specifier).lstrip("=")) for r in
               map(Requirement, suite.DEVICE_WHEELS)}  # fmt: skip
    image = {k: (Version(v) if v else None) for k, v in suite.DEVICE_IMAGE.items()}
    environment = {"python_version": "3.12", "platform_system": "Linux",
                   "platform_machine": "x86_64", "sys_platform": "linux", "extra": ""}  # fmt: skip
    roots = [Requirement(r) for r in importlib.metadata.requires("stepgap") or []]
    roots = [r for r in roots if r.marker is None or r.marker.evaluate(environment)]
    wanted = _imported_distributions(SCRIPT, REPO / "bench" / "nli_onnx.py")
    roots += [Requirement(name) for name in sorted(wanted | set(suite.SECTION_NEEDS))]
    missing, outside, seen = [], [], set()
    todo = [(r, "the suite") for r in roots]
    while todo:
        req, by = todo.pop()
        name = req.name.lower().replace("_", "-")
        version = carried.get(name, image.get(name))
        if name in carried or name in image:
            if version is not None and req.specifier and version not in req.specifier:
                where = "carried" if name in carried else "in the image"
                outside.append(f"{name} {version} ({where}) but {by} requires {req}")
        else:
            missing.append(f"{name} (required by {by})")
        if name in seen or name in image:
            continue  # the image's own requirements are the image's
        seen.add(name)
        try:
            here = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            continue
        if name in carried and here != carried[name]:
            continue  # another version here: its requirements are not the carried wheel's
        requires = importlib.metadata.requires(name) or []
        for line in requires:
            dep = Requirement(line)
            if dep.marker is None or dep.marker.evaluate(environment):
                todo.append((dep, name))
    assert not missing, f"neither in the image nor carried: {sorted(set(missing))}"
    assert not outside, sorted(set(outside))
