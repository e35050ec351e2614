"""Train the student judge: the script `accelerate launch` runs, the same as `stepgap train`.

    accelerate launch student/train.py --config student/configs/qwen2.5-7b-lora.yaml
    python student/train.py --config tiny --set max_steps=20
    stepgap train --config smollm2-135m --resume

`--config` is a recipe file or a packaged recipe by name; `--set key=value` overrides any recipe
key; `--resume` continues from the last checkpoint in `output_dir` (same step count as an
uninterrupted run); `--print-config` prints the resolved recipe.
"""

import sys

from stepgap.cli.student import train_main

if __name__ == "__main__":
    sys.exit(train_main())
