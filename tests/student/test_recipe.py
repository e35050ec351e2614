"""Student recipes: stepgap's parser (an HfArgumentParser, as TRL's is) reads them into stepgap's keys, TRL's SFTConfig and ModelConfig;
every shipped YAML parses and documents its keys, and errors name the key and where it was."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from stepgap.arguments import parse_sets
from stepgap.student.recipe import (
    Recipe,
    StudentArguments,
    load_config,
    make_parser,
)

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "student" / "configs").glob("*.yaml"))
MINIMAL = "model_name_or_path: x\ndataset: y\nuse_peft: true\n"


def _keys(path: Path) -> list[str]:
    return [line.split(":", 1)[0] for line in path.read_text().splitlines() if line[:1].isalpha()]


def test_the_four_recipes_ship():
    assert {p.stem for p in CONFIGS} >= {
        "tiny",
        "smollm2-135m",
        "qwen2.5-7b-lora",
        "qwen2.5-7b-qlora",
    }


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_recipe_parses_and_documents_every_key(path):
    from trl import ModelConfig, SFTConfig

    recipe = load_config(path)
    assert isinstance(recipe, Recipe)
    assert isinstance(recipe.training_args, SFTConfig)
    assert isinstance(recipe.model_args, ModelConfig)
    block_documented = False  # each block of keys opens with a comment that explains them
    for line in path.read_text().splitlines():
        if not line.strip():
            block_documented = False
        elif line.startswith("#"):
            block_documented = True
        else:
            assert block_documented, f"{path.name}: undocumented key {line!r}"
    keys = _keys(path)
    assert len(keys) == len(set(keys)), f"{path.name}: a key twice"
    assert {f.name for f in dataclasses.fields(StudentArguments)} <= set(keys)
    assert keys == _keys(CONFIGS[0]), "the recipes set the same keys, in the same order"


def test_qlora_recipe_is_4bit_and_lora_recipe_is_not():
    by_name = {p.stem: load_config(p).model_args for p in CONFIGS}
    qlora, lora = by_name["qwen2.5-7b-qlora"], by_name["qwen2.5-7b-lora"]
    assert qlora.load_in_4bit and qlora.bnb_4bit_quant_type == "nf4" and qlora.use_bnb_nested_quant
    assert not lora.load_in_4bit
    assert lora.use_peft and lora.lora_r == 16 and lora.lora_target_modules == "all-linear"


def test_any_sftconfig_field_is_a_recipe_key_a_set_and_a_flag(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(MINIMAL + "logging_first_step: true\nseed: 7\n")
    training = load_config(recipe).training_args
    assert training.logging_first_step and training.seed == 7
    assert load_config(recipe, {"seed": 11}).training_args.seed == 11
    argv = ["--config", str(recipe), "--set", "seed=11", "--seed", "12", "--learning_rate", "1e-4",
            "--no_gradient_checkpointing", "--use_rslora", "--resume"]  # fmt: skip
    script, training, model, run = make_parser().parse(argv)
    assert training.seed == 12  # the flag over --set over the file
    assert training.learning_rate == 1e-4 and not training.gradient_checkpointing
    assert model.use_rslora and run.resume
    assert script.dataset == "y" and script.eval_fraction == 0.1  # stepgap's default


def test_the_recipes_args_reach_the_trainer(tmp_path, tiny_qwen2, examples_dir, monkeypatch):
    """What the Trainer is built with: the recipe's own SFTConfig (a key the old recipe did not
    have included) and the LoRA config TRL makes from ModelConfig; without a held-out split the
    evaluation is off. Stopped before any step."""
    import stepgap.student.card
    from stepgap.student.trainer import train

    built = {}

    class Stop(Exception):
        pass

    def trainer(cls, card):
        def make(**kwargs):
            built.update(kwargs)
            raise Stop

        return make

    monkeypatch.setattr(stepgap.student.card, "publishing_trainer", trainer)
    recipe = load_config(
        "tiny",
        {
            "model_name_or_path": str(tiny_qwen2),
            "dataset": str(examples_dir / "teacher_verdicts.jsonl"),
            "eval_fraction": 0,
            "output_dir": str(tmp_path / "out"),
            "logging_first_step": True,
            "use_rslora": True,
        },
    )
    with pytest.raises(Stop):
        train(recipe)
    assert built["args"] is recipe.training_args and built["args"].logging_first_step
    assert built["args"].eval_strategy == "no" and built["eval_dataset"] is None
    peft = built["peft_config"]
    assert peft.r == 64 and peft.use_rslora and peft.target_modules == "all-linear"


def test_unknown_key_is_an_error_naming_the_file_and_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL + "learning_rte: 0.1\n")
    with pytest.raises(ValueError, match=rf"^{bad}:4: learning_rte: not a key of a training "
                       r"recipe .*did you mean learning_rate"):  # fmt: skip
        load_config(bad)
    old = tmp_path / "old.yaml"  # keys an earlier recipe had: TRL names them otherwise
    for key, new in (("model", "model_name_or_path"), ("warmup_ratio", "warmup_steps")):
        old.write_text(f"{MINIMAL}{key}: 0.03\n")
        with pytest.raises(ValueError, match=rf"old\.yaml:4: {key}: .*it is named {new}"):
            load_config(old)
    ok = tmp_path / "ok.yaml"
    ok.write_text(MINIMAL)
    with pytest.raises(ValueError, match=r"^--set max_steps: 'many' is not a valid value"):
        load_config(ok, {"max_steps": "many"})
    with pytest.raises(ValueError, match=r"^unrecognized arguments: --learning_rte \(did you "
                       r"mean --learning_rate\?\)"):  # fmt: skip
        make_parser().parse(["--config", str(ok), "--learning_rte", "0.1"])
    with pytest.raises(ValueError, match=r"argument --max_steps: invalid int"):
        make_parser().parse(["--config", str(ok), "--max_steps", "many"])


def test_overrides_are_yaml_scalars():
    assert parse_sets(
        ["max_steps=3", "init_adapter=null", "use_cpu=true", "model_name_or_path=a/b"]
    ) == {"max_steps": 3, "init_adapter": None, "use_cpu": True, "model_name_or_path": "a/b"}
    with pytest.raises(ValueError, match="key=value"):
        parse_sets(["max_steps"])


def test_a_packaged_recipe_loads_by_name_and_prints_as_a_file(tmp_path, monkeypatch, capsys):
    from stepgap.cli import main

    monkeypatch.chdir(tmp_path)  # no student/configs/ here
    assert load_config("qwen2.5-7b-qlora").model_args.load_in_4bit
    with pytest.raises(FileNotFoundError, match="one of: prm-deberta-v3-base, .*, qwen2.5-7b-lora"):
        load_config("qwen3")
    argv = ["train", "--config", "tiny", "--set", "max_steps=7", "--seed", "5", "--print-config"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    resolved = yaml.safe_load(printed)
    assert resolved["max_steps"] == 7 and resolved["seed"] == 5
    assert resolved["model_name_or_path"] == "tiny-random:qwen2"
    assert not (tmp_path / "student_out").exists()  # printed, not trained
    (tmp_path / "resolved.yaml").write_text(printed)  # read back: the same recipe
    assert main(["train", "--config", "resolved.yaml", "--print-config"]) == 0
    assert capsys.readouterr().out == printed
    again = load_config("resolved.yaml")
    assert again.training_args.to_dict() == load_config("tiny", resolved).training_args.to_dict()


def test_a_token_key_is_refused_with_where_to_put_it(tmp_path):
    secret = "hf_secret_value"
    bad = tmp_path / "push.yaml"
    bad.write_text(f"{MINIMAL}hub_token: {secret}\n")
    with pytest.raises(ValueError, match=r"push\.yaml:4: hub_token: a token never goes "
                       r"in a recipe.*set HF_TOKEN") as refused:  # fmt: skip
        load_config(bad)
    assert secret not in str(refused.value)
    ok = tmp_path / "ok.yaml"
    ok.write_text(MINIMAL)
    with pytest.raises(ValueError, match=r"^--set hub_token: a token never goes in a recipe"):
        load_config(ok, {"hub_token": secret})
    with pytest.raises(ValueError, match=r"^--hub_token: a token never goes") as refused:
        make_parser().parse(["--config", str(ok), "--hub_token", secret])
    assert secret not in str(refused.value)


def test_push_to_hub_needs_a_repo_id(tmp_path):
    recipe = tmp_path / "push.yaml"
    recipe.write_text(MINIMAL + "push_to_hub: true\n")
    with pytest.raises(ValueError, match=r"push\.yaml: hub_model_id: push_to_hub is true but no "
                       r"repo is named: set hub_model_id"):  # fmt: skip
        load_config(recipe)
    recipe.write_text(recipe.read_text() + "hub_model_id: null\n")
    with pytest.raises(ValueError, match=r"push\.yaml:5: hub_model_id: push_to_hub"):
        load_config(recipe)
    training = load_config(recipe, {"hub_model_id": "user/stepgap-student"}).training_args
    assert training.push_to_hub and training.hub_model_id == "user/stepgap-student"
    with pytest.raises(ValueError, match=r"^--set hub_strategy: 'sometimes' is not one of end"):
        load_config(recipe, {"hub_model_id": "u/x", "hub_strategy": "sometimes"})


def test_what_stepgap_needs_of_the_model_keys(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("dataset: y\nuse_peft: true\n")
    with pytest.raises(ValueError, match=r"r\.yaml: model_name_or_path: no base model"):
        load_config(recipe)
    recipe.write_text(MINIMAL)
    with pytest.raises(ValueError, match=r"^--set use_peft: the student is a LoRA adapter"):
        load_config(recipe, {"use_peft": False})
    with pytest.raises(ValueError, match=r"^--set dtype: 'float64' is not one of auto"):
        load_config(recipe, {"dtype": "float64"})


def test_bf16_follows_the_weights_unless_the_recipe_says(tmp_path):
    """TRL's bf16 default (on unless fp16) would refuse every CPU-only machine; left out of a
    recipe, it is on for bf16 weights or a 4-bit base, where the machine has bf16."""
    import torch

    bf16_gpu = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    assert not load_config("tiny").training_args.bf16  # float32 weights
    assert load_config("qwen2.5-7b-lora").training_args.bf16 == bf16_gpu  # auto
    assert load_config("tiny", {"load_in_4bit": True}).training_args.bf16  # use_cpu: CPU bf16
    assert load_config("tiny", {"dtype": "bfloat16"}).training_args.bf16
    assert not load_config("tiny", {"dtype": "bfloat16", "bf16": False}).training_args.bf16


def test_kernel_keys_default_to_transformers_own():
    recipe = load_config("qwen2.5-7b-lora")
    assert recipe.model_args.attn_implementation is None
    assert recipe.training_args.use_liger_kernel is False
    recipe = load_config("tiny", {"attn_implementation": "sdpa", "use_liger_kernel": True})
    assert recipe.model_args.attn_implementation == "sdpa" and recipe.training_args.use_liger_kernel


def test_attn_implementation_reaches_the_model(tiny_qwen2):
    from stepgap.student.trainer import load_student_base

    default, _ = load_student_base(load_config("tiny", {"model_name_or_path": str(tiny_qwen2)}))
    assert default.config._attn_implementation == "sdpa"  # transformers' own choice
    recipe = load_config(
        "tiny", {"model_name_or_path": str(tiny_qwen2), "attn_implementation": "eager"}
    )
    model, _ = load_student_base(recipe)
    assert model.config._attn_implementation == "eager"


def _liger_recipe(tmp_path, tiny_qwen2, examples_dir, **keys):
    """The tiny recipe on the tiny Qwen2 with `use_liger_kernel` on."""
    return load_config(
        "tiny",
        {
            "model_name_or_path": str(tiny_qwen2),
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
    recipe = _liger_recipe(tmp_path, tiny_qwen2, examples_dir, max_train_examples=2, max_steps=1)
    with pytest.raises(ImportError, match="liger-kernel"):
        train(recipe)


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
    recipe = _liger_recipe(
        tmp_path, tiny_qwen2, examples_dir, max_train_examples=4, max_steps=2, dtype="bfloat16"
    )
    metrics = train(recipe)
    assert metrics["train_loss"] > 0
