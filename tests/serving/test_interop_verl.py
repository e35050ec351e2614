"""The reward through veRL 0.9.1's own code: its loader and reward managers against a live
`stepgap serve` (the `interop` extra installs veRL beside the suite; `make test-peers` runs this
file again with veRL's own dependencies and transformers window). Rewards must equal those of
the stored example verdicts."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
import pytest

import stepgap.serving
from tests.fixtures.peers import import_peer
from tests.serving.conftest import chat_prompt

verl = import_peer("verl")

from omegaconf import OmegaConf  # noqa: E402  (a veRL dependency)
from verl import DataProto  # noqa: E402

SERVING = Path(stepgap.serving.__file__).parent
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def event_loop_of_this_worker():
    """veRL's managers keep the thread's event loop (as a Ray worker has one); PRIME's scoring
    closes the one it made, so each test starts with a fresh one."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    loop.close()
    asyncio.set_event_loop(None)


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_qwen2)


def batch(traces, tokenizer, rows=None) -> DataProto:
    """veRL's rollout batch for the example traces: left-padded prompts, right-padded responses.
    With `rows` (veRL's `RLHFDataset` items, one per trace) the prompts, `reward_model` and
    `extra_info` are the rows': their chat messages through the chat template, as veRL renders."""
    import torch

    texts = [chat_prompt(t.question) for t in traces]
    gold = [{"ground_truth": {"target": t.golden_answers}} for t in traces]
    extra = [{"question": t.question} for t in traces]
    if rows is not None:
        texts = [tokenizer.apply_chat_template(list(r["raw_prompt"]), add_generation_prompt=True,
                                               tokenize=False) for r in rows]  # fmt: skip
        gold, extra = [r["reward_model"] for r in rows], [r["extra_info"] for r in rows]
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in texts]
    responses = [tokenizer(t.response, add_special_tokens=False)["input_ids"] for t in traces]
    p_len, r_len = max(map(len, prompts)), max(map(len, responses))
    pad = tokenizer.pad_token_id
    prompt_ids = torch.tensor([[pad] * (p_len - len(p)) + p for p in prompts])
    response_ids = torch.tensor([r + [pad] * (r_len - len(r)) for r in responses])
    mask = torch.tensor(
        [[0] * (p_len - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (r_len - len(r))
         for p, r in zip(prompts, responses, strict=True)]
    )  # fmt: skip
    return DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": response_ids, "attention_mask": mask,
                 "input_ids": torch.cat([prompt_ids, response_ids], dim=1)},
        non_tensors={
            "data_source": np.array(["hotpotqa"] * len(traces), dtype=object),
            "reward_model": np.array(gold, dtype=object),
            "extra_info": np.array(extra, dtype=object),
        },
    )  # fmt: skip


def verl_config(
    path: str, name: str, url: str, manager: str = "naive", module_path: str | None = None
) -> object:
    return OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": path, "name": name, "reward_kwargs": {"url": url},
                },
                "reward_manager": {
                    "source": "importlib" if module_path else "register", "name": manager,
                    "module": {"path": module_path} if module_path else None,
                },
                "reward_kwargs": {},
                "sandbox_fusion": None,
            }
        }
    )  # fmt: skip


def _run_single_all(manager, data) -> list:
    """What veRL's RewardLoopWorker does (without Ray): run_single per sample, concurrently, on
    the event loop the manager was made with."""

    async def run():
        return await asyncio.gather(
            *(manager.run_single(data[i : i + 1]) for i in range(len(data)))
        )

    return manager.loop.run_until_complete(run())


@pytest.mark.parametrize("path_form", ["file", "pkg"])
@pytest.mark.parametrize("manager", ["naive", "dapo"])
def test_verl_loads_compute_score_and_its_managers_score_it(
    served, tokenizer, example_traces, expected_rewards, path_form, manager
):
    """veRL's own `load_reward_manager` loads the module by file path (relative imports would
    fail there) or as `pkg://`, passes `reward_kwargs` and its own keyword arguments."""
    from verl.trainer.ppo.reward import load_reward_manager

    path = str(SERVING / "verl.py") if path_form == "file" else "pkg://stepgap.serving.verl"
    rm = load_reward_manager(verl_config(path, "compute_score", served, manager), tokenizer)
    outs = _run_single_all(rm, batch(example_traces, tokenizer))
    got = [o["reward_score"] for o in outs]
    assert got == pytest.approx([expected_rewards[t.id] for t in example_traces])
    assert {"em", "rate_CC", "failed_checks"} <= set(outs[0]["reward_extra_info"])


def test_verl_prime_manager_gets_a_float_and_forked_workers_get_their_own_client(
    served, tokenizer, example_traces, expected_rewards, monkeypatch
):
    """PRIME calls `float(result)` in a forked process pool: `compute_score_float` gives the
    number, and a client made in the parent before the fork is not shared with the workers."""
    from verl.workers.reward_manager import PrimeRewardManager

    from stepgap.serving import verl as verl_reward

    monkeypatch.setenv("STEPGAP_REWARD_URL", served)
    t = example_traces[0]  # the parent scores once: its HTTP client exists before the fork
    assert verl_reward.compute_score_float(
        "x", t.response, t.golden_answers, {"question": t.question}
    ) == (pytest.approx(expected_rewards[t.id]))
    data = batch(example_traces, tokenizer)
    tensor = PrimeRewardManager(
        tokenizer, num_examine=0, compute_score=verl_reward.compute_score_float
    )(data)
    last = data.batch["attention_mask"][:, data.batch["prompts"].shape[1] :].sum(-1) - 1
    got = [float(tensor[i, last[i]]) for i in range(len(example_traces))]
    assert got == pytest.approx([expected_rewards[t.id] for t in example_traces])
    # the dict form would have been scored 0 by PRIME for every sample
    assert any(g != 0 for g in got)


def test_verl_batch_manager_passes_reward_kwargs_to_compute_score_batch(
    served, tokenizer, example_traces, expected_rewards
):
    from verl.workers.reward_manager import BatchRewardManager

    from stepgap.serving import verl as verl_reward

    rm = BatchRewardManager(
        tokenizer, num_examine=0, compute_score=verl_reward.compute_score_batch, url=served
    )
    out = rm(batch(example_traces, tokenizer), return_dict=True)
    assert list(out["reward_extra_info"]["score"]) == pytest.approx(
        [expected_rewards[t.id] for t in example_traces]
    )


def test_the_dense_manager_puts_each_bracket_on_its_steps_last_token(
    served, tokenizer, example_traces, expected_rewards
):
    """`StepGapRewardManager` through veRL's loader (`source: importlib`): every row of
    `rm_scores` sums to the reward, each step's bracket sits on the token that ends the step."""
    from verl.trainer.ppo.reward import load_reward_manager

    cfg = verl_config("pkg://stepgap.serving.verl", "compute_score", served,
                      manager="StepGapRewardManager", module_path="pkg://stepgap.serving.verl_manager")  # fmt: skip
    rm = load_reward_manager(cfg, tokenizer)
    data = batch(example_traces, tokenizer)
    outs = _run_single_all(rm, data)
    rm_scores = type(rm).assemble_rm_scores(data, [o["reward_score"] for o in outs])
    assert rm_scores.sum(-1).tolist() == pytest.approx(
        [expected_rewards[t.id] for t in example_traces]
    )
    case2 = example_traces[1]  # case2: brackets 0.2, 0.2, 0.2 and MB -0.05 (+ its shaping)
    row = rm_scores[1]
    nonzero = row.nonzero().flatten().tolist()
    response = tokenizer(case2.response, add_special_tokens=False)["input_ids"]
    steps = [s for s in case2.steps if s.span]
    assert len(nonzero) == len(steps)  # one entry per step (EM 0: no extra last-token entry)
    for index, step in zip(nonzero, steps, strict=True):
        covered = tokenizer.decode(response[: index + 1], skip_special_tokens=True)
        before = tokenizer.decode(response[:index], skip_special_tokens=True)
        assert len(before) < step.span[1] <= len(covered)  # the token holding the step's end
    assert sum(v for _, v in outs[1]["reward_score"]["dense"]) == pytest.approx(
        expected_rewards[case2.id]
    )


def readme_verl_manager_names() -> list[str]:
    """The reward managers the veRL page's config names: its `{name: ...}` and the list in the
    comment beside it."""
    page = Path(__file__).resolve().parents[2] / "docs" / "rl" / "verl.md"
    text = page.read_text(encoding="utf-8")
    m = re.search(r"reward_manager: \{name: (\w+)\}\s*# veRL's own: ([^\n]+)", text)
    assert m, "docs/rl/verl.md: the config's `reward_manager: {name: ...}  # veRL's own: ...` line"
    return [m.group(1), *(name.strip() for name in m.group(2).split(","))]


def test_every_verl_manager_the_docs_name_is_in_verls_registry():
    """The docs' config (`source: register`, veRL's default) resolves through the reward
    loop's registry (`verl.experimental.reward_loop.reward_manager`), as `load_reward_manager`
    does; a name it does not know is veRL's `Unknown reward manager` at start-up."""
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    names = readme_verl_manager_names()
    assert len(set(names)) >= 4, names  # naive, dapo, gdpo, rate_limited
    for name in names:
        cfg = verl_config("pkg://stepgap.serving.verl", "compute_score", "http://x:1", name)
        assert issubclass(resolve_reward_manager_cls(cfg), RewardManagerBase), name


def search_r1_parquet(traces, path: Path) -> Path:
    """The example questions as Search-R1's `scripts/data_process/nq_search.py` writes them
    (`datasets.to_parquet`): the question only in the user turn's template, `extra_info` =
    {split, index}."""
    import datasets

    from stepgap.data_builders.rollout_formats import SEARCH_R1_TEMPLATE

    rows = [
        {"data_source": "nq",
         "prompt": [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(question=t.question)}],
         "ability": "fact-reasoning",
         "reward_model": {"style": "rule", "ground_truth": {"target": t.golden_answers}},
         "extra_info": {"split": "train", "index": i}}
        for i, t in enumerate(traces)
    ]  # fmt: skip
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def verl_rows(path: Path, tokenizer, cache: Path) -> list[dict]:
    """The parquet's rows as veRL's own `RLHFDataset` reads them for the rollout."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(cache)})
    data = RLHFDataset(str(path), tokenizer, config)
    return [data[i] for i in range(len(data))]


def test_the_dense_manager_reads_search_r1_questions_from_the_prompt_ids(
    served, tokenizer, example_traces, expected_rewards, tmp_path
):
    """Search-R1's parquet as it ships (no question in `extra_info`): the dense manager decodes
    the prompt ids and reads the `Question:` line, and scores as with the question given."""
    from verl.trainer.ppo.reward import load_reward_manager

    rows = verl_rows(search_r1_parquet(example_traces, tmp_path / "train.parquet"), tokenizer,
                     tmp_path / "cache")  # fmt: skip
    assert {tuple(sorted(r["extra_info"])) for r in rows} == {("index", "split")}
    cfg = verl_config("pkg://stepgap.serving.verl", "compute_score", served,
                      manager="StepGapRewardManager", module_path="pkg://stepgap.serving.verl_manager")  # fmt: skip
    rm = load_reward_manager(cfg, tokenizer)
    data = batch(example_traces, tokenizer, rows)
    outs = _run_single_all(rm, data)
    rm_scores = type(rm).assemble_rm_scores(data, [o["reward_score"] for o in outs])
    assert rm_scores.sum(-1).tolist() == pytest.approx(
        [expected_rewards[t.id] for t in example_traces]
    )
    assert all(o["reward_extra_info"]["failed_checks"] == 0 for o in outs)


def test_search_r1_data_stops_the_naive_manager_naming_the_fix_and_scores_once_prepared(
    served, tokenizer, example_traces, expected_rewards, tmp_path, capsys
):
    """veRL's naive manager hands `compute_score` no prompt: on Search-R1's parquet the first
    batch raises, naming `stepgap prepare-verl-data`; the prepared file scores as expected."""
    from verl.trainer.ppo.reward import load_reward_manager

    from stepgap.cli import main

    raw = search_r1_parquet(example_traces, tmp_path / "train.parquet")
    rm = load_reward_manager(
        verl_config("pkg://stepgap.serving.verl", "compute_score", served), tokenizer
    )
    data = batch(example_traces, tokenizer, verl_rows(raw, tokenizer, tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"extra_info\['question'\]") as error:
        _run_single_all(rm, data)
    assert "`stepgap prepare-verl-data " in str(error.value)

    prepared = tmp_path / "train_q.parquet"
    assert main(["prepare-verl-data", str(raw), "-o", str(prepared)]) == 0
    rows = verl_rows(prepared, tokenizer, tmp_path / "cache")
    assert [r["extra_info"]["question"] for r in rows] == [t.question for t in example_traces]
    outs = _run_single_all(rm, batch(example_traces, tokenizer, rows))
    assert [o["reward_score"] for o in outs] == pytest.approx(
        [expected_rewards[t.id] for t in example_traces]
    )
