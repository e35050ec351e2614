"""Student recipes: every shipped YAML validates, documents each key, and errors are clear."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stepgap.student.recipe import StudentTrainConfig, load_config, parse_overrides

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "student" / "configs").glob("*.yaml"))


def test_the_four_recipes_ship():
    assert {p.stem for p in CONFIGS} >= {
        "tiny",
        "smollm2-135m",
        "qwen2.5-7b-lora",
        "qwen2.5-7b-qlora",
    }


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_recipe_validates_and_documents_every_key(path):
    cfg = load_config(path)
    assert isinstance(cfg, StudentTrainConfig)
    block_documented = False  # each block of keys opens with a comment that explains them
    keys = set()
    for line in path.read_text().splitlines():
        if not line.strip():
            block_documented = False
        elif line.startswith("#"):
            block_documented = True
        else:
            assert block_documented, f"{path.name}: undocumented key {line!r}"
            keys.add(line.split(":", 1)[0])
            block_documented = True  # the comment covers the rest of its block
    assert keys == set(StudentTrainConfig.model_fields), f"{path.name} should set every key"


def test_qlora_recipe_is_4bit_and_lora_recipe_is_not():
    by_name = {p.stem: load_config(p) for p in CONFIGS}
    assert by_name["qwen2.5-7b-qlora"].load_in_4bit
    assert not by_name["qwen2.5-7b-lora"].load_in_4bit
    assert by_name["qwen2.5-7b-lora"].lora_r == 16
    assert by_name["qwen2.5-7b-lora"].target_modules == "all-linear"


def test_unknown_key_is_an_error_naming_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: x\ndataset: y\noutput_dir: z\nlearning_rte: 0.1\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: learning_rte \(line 4\): Extra inputs"):
        load_config(bad)
    ok = tmp_path / "ok.yaml"
    ok.write_text("model: x\ndataset: y\noutput_dir: z\n")
    with pytest.raises(ValueError, match=r"max_steps \(--set\)"):
        load_config(ok, {"max_steps": "many"})


def test_overrides_are_yaml_scalars():
    assert parse_overrides(["max_steps=3", "init_adapter=null", "use_cpu=true", "model=a/b"]) == {
        "max_steps": 3,
        "init_adapter": None,
        "use_cpu": True,
        "model": "a/b",
    }
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides(["max_steps"])


def test_a_packaged_recipe_loads_by_name_from_any_folder(tmp_path, monkeypatch, capsys):
    from stepgap.cli import main

    monkeypatch.chdir(tmp_path)  # no student/configs/ here
    assert load_config("qwen2.5-7b-qlora").load_in_4bit
    with pytest.raises(FileNotFoundError, match="one of: qwen2.5-7b-lora, qwen2.5-7b-qlora"):
        load_config("qwen3")
    assert main(["train", "--config", "tiny", "--set", "max_steps=7", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["max_steps"] == 7 and printed["model"] == "tiny-random:qwen2"
    assert not (tmp_path / "student_out").exists()  # printed, not trained


def test_a_token_key_is_refused_with_where_to_put_it(tmp_path):
    bad = tmp_path / "push.yaml"
    bad.write_text("model: x\ndataset: y\noutput_dir: z\nhub_token: hf_secret_value\n")
    with pytest.raises(ValueError, match=r"push\.yaml: hub_token \(line 4\): a token never goes "
                       r"in a recipe.*set HF_TOKEN") as refused:  # fmt: skip
        load_config(bad)
    assert "hf_secret_value" not in str(refused.value)
    ok = tmp_path / "ok.yaml"
    ok.write_text("model: x\ndataset: y\noutput_dir: z\n")
    with pytest.raises(ValueError, match=r"hub_token \(--set\): a token never goes in a recipe"):
        load_config(ok, {"hub_token": "hf_secret_value"})


def test_push_to_hub_needs_a_repo_id(tmp_path):
    recipe = tmp_path / "push.yaml"
    recipe.write_text("model: x\ndataset: y\noutput_dir: z\npush_to_hub: true\n")
    with pytest.raises(ValueError, match=r"push\.yaml: hub_model_id \(missing\): .*push_to_hub "
                       r"is true but no repo is named: set hub_model_id"):  # fmt: skip
        load_config(recipe)
    recipe.write_text(recipe.read_text() + "hub_model_id: null\n")
    with pytest.raises(ValueError, match=r"hub_model_id \(line 5\)"):
        load_config(recipe)
    cfg = load_config(recipe, {"hub_model_id": "user/stepgap-student"})
    assert cfg.push_to_hub and cfg.hub_model_id == "user/stepgap-student"
    with pytest.raises(ValueError, match=r"hub_strategy \(--set\): Input should be 'end'"):
        load_config(recipe, {"hub_model_id": "u/x", "hub_strategy": "sometimes"})


def test_hub_keys_are_the_trainers_with_its_defaults():
    """The four keys go to TrainingArguments as they are: same values allowed, same defaults."""
    import dataclasses
    from typing import get_args

    from transformers import TrainingArguments
    from transformers.trainer_utils import HubStrategy

    fields = StudentTrainConfig.model_fields
    strategies = get_args(fields["hub_strategy"].annotation)
    assert set(strategies) == {s.value for s in HubStrategy}
    theirs = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    for key in ("push_to_hub", "hub_model_id", "hub_strategy", "hub_private_repo"):
        assert fields[key].default == theirs[key], key
    assert "hub_token" not in fields


def test_kernel_keys_default_to_transformers_own_and_are_checked():
    cfg = load_config("qwen2.5-7b-lora")
    assert cfg.attn_implementation is None and cfg.use_liger_kernel is False
    cfg = load_config("tiny", {"attn_implementation": "sdpa", "use_liger_kernel": True})
    assert cfg.attn_implementation == "sdpa" and cfg.use_liger_kernel
    with pytest.raises(ValueError, match=r"attn_implementation \(--set\): Input should be"):
        load_config("tiny", {"attn_implementation": "flash"})


def test_attn_implementation_reaches_the_model(tiny_qwen2):
    from stepgap.student.trainer import load_student_base

    default, _ = load_student_base(load_config("tiny", {"model": str(tiny_qwen2)}))
    assert default.config._attn_implementation == "sdpa"  # transformers' own choice
    cfg = load_config("tiny", {"model": str(tiny_qwen2), "attn_implementation": "eager"})
    model, _ = load_student_base(cfg)
    assert model.config._attn_implementation == "eager"


def _liger_recipe(tmp_path, tiny_qwen2, examples_dir, **keys):
    """The tiny recipe on the tiny Qwen2 with `use_liger_kernel` on."""
    return load_config(
        "tiny",
        {
            "model": str(tiny_qwen2),
            "dataset": str(examples_dir / "teacher_verdicts.jsonl"),
            "output_dir": str(tmp_path / "out"),
            "use_liger_kernel": True,
            **keys,
        },
    )


def test_use_liger_kernel_reaches_the_trainer(tmp_path, tiny_qwen2, examples_dir):
    """Without liger-kernel installed, transformers' Trainer refuses the key by name: proof
    that train() passed it on (a dropped key would train without a word)."""
    import importlib.util

    from stepgap.student.trainer import train

    if importlib.util.find_spec("liger_kernel") is not None:
        pytest.skip("liger-kernel is installed: the Trainer would accept the key")
    # a dropped key would train this one step and fail the test
    cfg = _liger_recipe(tmp_path, tiny_qwen2, examples_dir, max_train_examples=2, max_steps=1)
    with pytest.raises(ImportError, match="liger-kernel"):
        train(cfg)


def test_use_liger_kernel_trains_a_step_on_a_gpu(tmp_path, tiny_qwen2, examples_dir):
    """On transformers 5 Liger patches the student's Qwen2 modules and trains. Its kernels are
    Triton GPU kernels: on a CPU Triton finds no driver ("0 active drivers"), so this runs where
    a CUDA GPU and liger-kernel (`pip install 'stepgap[liger]'`) are."""
    import importlib.util

    import torch

    from stepgap.student.trainer import train

    if importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("liger-kernel is not installed (pip install 'stepgap[liger]')")
    if not torch.cuda.is_available():
        pytest.skip("Liger's kernels are Triton GPU kernels: Triton has no CPU driver")
    cfg = _liger_recipe(
        tmp_path, tiny_qwen2, examples_dir, max_train_examples=4, max_steps=2, dtype="bfloat16"
    )
    metrics = train(cfg)
    assert metrics["train_loss"] > 0
