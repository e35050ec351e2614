"""Side by side, per step: the bundle's student in-process and served by llama-server.

    python tools/llama_student_table.py BUNDLE TRACES IN_PROCESS.jsonl SERVED.jsonl URL

Prints one row per step (label, and whether the judge answer parsed, else its error), the
agreement, and a check of the conversion itself: for every judge prompt of TRACES, the chat
template and the token ids of llama-server (`/apply-template`, `/tokenize`) against those of the
bundle's tokenizer in transformers. Run by tools/llama_student_check.sh."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _verdicts(path: str) -> dict[tuple[str, int], dict]:
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    return {(r["trace_id"], r["step"]): r for r in rows}


def _answer(v: dict | None) -> tuple[str, str]:
    """(label, what became of the judge answer) of one verdict."""
    if v is None:
        return "-", "no verdict"
    if v.get("judge") is not None:
        return str(v["label"]), "parsed"
    error = (v.get("error") or "").replace("the answer was ", "").replace("judge gave no ", "")
    return str(v["label"] or "-"), f"error: {error[:44]}"


def _leaves(obj: object, prefix: str = "") -> dict[str, object]:
    if not isinstance(obj, dict):
        return {prefix: obj}
    return {k: v for key, value in obj.items() for k, v in _leaves(value, key).items()}


def _differs(a: dict | None, b: dict | None) -> str:
    """The judge fields (leaf names) in which two parsed answers differ."""
    if a is None or b is None:
        return ""
    x, y = _leaves(a), _leaves(b)
    names = [k for k in x if x[k] != y.get(k)]
    return ", ".join(names[:2]) + (f" +{len(names) - 2}" if len(names) > 2 else "")


def table(in_process: str, served: str) -> int:
    local, remote = _verdicts(in_process), _verdicts(served)
    keys = [*local, *(k for k in remote if k not in local)]
    head = ("trace", "step", "in-process", "answer", "llama-server", "answer", "same", "differs in")
    rows = []
    for key in keys:
        a, b = local.get(key), remote.get(key)
        (la, pa), (lb, pb) = _answer(a), _answer(b)
        judges = (a or {}).get("judge"), (b or {}).get("judge")
        same_judge = judges[0] is not None and judges[0] == judges[1]
        if same_judge:
            same = "judge"  # the same judge object, so the same label
        elif la == lb:
            same = "label" if la != "-" else "both failed"
        else:
            same = "no"
        rows.append((key[0][:28], str(key[1]), la, pa, lb, pb, same, _differs(*judges)))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    parsed = [sum(r[i] == "parsed" for r in rows) for i in (3, 5)]
    print(
        f"\n{len(rows)} steps: answers parsed in-process {parsed[0]}, llama-server {parsed[1]}; "
        f"same label {sum(r[2] == r[4] != '-' for r in rows)}, same judge object "
        f"{sum(r[6] == 'judge' for r in rows)}"
    )
    return len(rows)


def prompts_match(bundle: str, traces: str, url: str) -> None:
    """llama-server's chat template and tokens for each judge prompt against transformers'."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from stepgap.segment import iter_traces
    from stepgap.teacher.prompt import build_requests

    hf_logging.set_verbosity_error()  # a local folder's tokenizer warns of a Mistral regex
    tokenizer = AutoTokenizer.from_pretrained(Path(bundle) / "student")
    root = url.removesuffix("/v1")
    same_text = same_ids = n = 0
    for trace in iter_traces(traces):
        for request in build_requests(trace.id, trace.question, trace.steps):
            n += 1
            messages = [dict(m) for m in request.messages]
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            served = _post(f"{root}/apply-template", {"messages": messages})["prompt"]
            same_text += served == text
            ids = _post(f"{root}/tokenize", {"content": text, "parse_special": True})["tokens"]
            same_ids += ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    print(
        f"judge prompts: {n}; llama-server's chat template gives transformers' text for "
        f"{same_text}, its tokenizer transformers' token ids for {same_ids}"
    )


def main(argv: list[str]) -> int:
    bundle, traces, in_process, served, url = argv
    table(in_process, served)
    prompts_match(bundle, traces, url)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
