"""GRPO with the stepgap typed reward in TRL's `GRPOTrainer`.

    python examples/grpo_trl.py --model Qwen/Qwen2.5-7B-Instruct \
        --judge openai:gpt-4.1-mini --nli MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli
    python examples/grpo_trl.py --model Qwen/Qwen2.5-7B-Instruct --bundle bundle   # offline

The prompts are the example questions in Search-R1's template; `golden_answers` is a dataset
column, so TRL passes it to the reward function. Each group of completions gets rewards from
the checker; their spread is GRPO's advantage, so a reward that varies within a group moves the
policy. The test suite runs two steps on CPU with a tiny policy taught to write the examples'
Search-R1 responses, an OpenAI-compatible judge on 127.0.0.1 and a tiny NLI model, and checks
that rewards vary and the weights move. A real run adds a retriever between `<search>` and
`<information>` (TRL's tool calling or a rollout function), which is outside this example.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stepgap.data_builders.rollout_formats import SEARCH_R1_TEMPLATE, question_text


def build_dataset(traces_path: Path):
    from datasets import Dataset

    rows = [json.loads(line) for line in traces_path.read_text().splitlines() if line.strip()]
    return Dataset.from_list(
        [
            {
                "prompt": [
                    {
                        "role": "user",
                        "content": SEARCH_R1_TEMPLATE.format(question=question_text(r["question"])),
                    }
                ],
                "question": r["question"],
                "golden_answers": r["golden_answers"]
                if isinstance(r["golden_answers"], list)
                else [r["golden_answers"]],
            }
            for r in rows
        ]
    )


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="policy: hub id or local path")
    p.add_argument("--judge", help="judge spec, e.g. openai:gpt-4.1-mini or hf:PATH")
    p.add_argument("--base-url", help="OpenAI-compatible server of an openai: judge")
    p.add_argument("--nli", help="NLI model: hub id or local path")
    p.add_argument("--bundle", help="an exported offline checker (instead of --judge/--nli)")
    p.add_argument("--traces", default=str(Path(__file__).with_name("traces.jsonl")))
    p.add_argument("--output", default="grpo_out")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--variant", default="typed_shape")
    p.add_argument("--max-completion-length", type=int, default=256)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--learning-rate", type=float, default=1e-5)
    p.add_argument("--judge-max-string-chars", type=int, default=None)
    p.add_argument("--cpu", action="store_true", help="force CPU")
    args = p.parse_args(argv)

    from trl import GRPOConfig, GRPOTrainer

    from stepgap.export import OfflineChecker
    from stepgap.serving import StepGapReward
    from stepgap.serving.trl import stepgap_reward_func
    from stepgap.teacher import build_checker
    from stepgap.teacher.judges.hf import StudentJudgeOptions

    if args.bundle:  # the exported checker: its student as the judge, its ONNX NLI model
        checker = OfflineChecker.from_bundle(args.bundle, StudentJudgeOptions(max_tokens=256))
    else:
        checker = build_checker(
            args.judge,
            args.nli,
            judge_options={
                "base_url": args.base_url,
                "max_string_chars": args.judge_max_string_chars,
                "max_tokens": 256,
                "no_cache": True,
            },
        )
    reward = StepGapReward(checker, variant=args.variant)
    config = GRPOConfig(
        output_dir=args.output,
        max_steps=args.steps,
        per_device_train_batch_size=args.num_generations,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        learning_rate=args.learning_rate,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=args.cpu,
        bf16=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=[stepgap_reward_func(reward)],
        args=config,
        train_dataset=build_dataset(Path(args.traces)),
    )
    trainer.train()
    trainer.save_model(args.output)
    history = trainer.state.log_history
    (Path(args.output) / "log_history.json").write_text(json.dumps(history, indent=2))
    for row in history:
        print({k: v for k, v in row.items() if "reward" in k or k in ("step", "loss")})
    return {"log_history": history}


if __name__ == "__main__":
    main()
