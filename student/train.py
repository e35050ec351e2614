"""Train the student judge.

    accelerate launch student/train.py --config student/configs/qwen2.5-7b-lora.yaml
    python student/train.py --config student/configs/tiny.yaml --set max_steps=20
    stepgap train --config student/configs/smollm2-135m.yaml --resume

`--set key=value` overrides any config key; `--resume` continues from the last checkpoint in
`output_dir` (same step count as an uninterrupted run).
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML recipe (student/configs/*.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")


def run(args: argparse.Namespace) -> int:
    from stepgap.student.config import load_config, parse_overrides

    try:
        cfg = load_config(args.config, parse_overrides(args.set))
    except (ValueError, FileNotFoundError) as exc:
        print(f"student/train.py: error: {exc}", file=sys.stderr)
        return 2
    from stepgap.student.sft import train

    metrics = train(cfg, resume=args.resume)
    print(json.dumps(metrics, indent=2, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="LoRA/QLoRA SFT of the stepgap student judge")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
