"""Break each promise of RELIABILITY.md on purpose and show that its test catches it.

For every promise: apply one small mutation to the package source (the kind of bug that would
break the promise), run the promise's tests, expect them to FAIL, and restore the file. A
mutation its tests do not catch is printed as MISSED and the exit status is 1. A test that runs
into its time limit catches only the mutations that break a promise of bounded time (marked
`hangs`); for any other it says nothing (the machine may just be slow) and is printed as TIMED
OUT, also with exit status 1: run that row again on a quieter machine.

    python tools/break_promises.py            # all promises, in order
    python tools/break_promises.py -k server  # those whose name contains "server"
    STEPGAP_TEST_CACHE=/tmp/stepgap-test-cache python tools/break_promises.py -k tests/
                                              # the test-power mutations, NLI stand-in built once

Edits files in place (the package is installed in editable mode, so tests must see the edited
tree) and always restores them; it refuses to run on files with uncommitted changes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# what pytest-timeout prints when a test runs into its limit (signal and thread methods)
TIMEOUT_MARKS = ("from pytest-timeout.", "+ Timeout +")


@dataclass(frozen=True)
class Mutation:
    promise: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    timeout: int = 600
    # the broken promise shows as a test that never ends: its time limit is the catch
    hangs: bool = False


MUTATIONS = [
    Mutation(
        "bad-record/invalid-json",
        "stepgap/io.py",
        'report.add(path, lineno, f"invalid JSON: {exc.msg} (column {exc.colno})")\n'
        "                continue",
        "raise",
        ("tests/test_bad_input.py::test_segment",),
    ),
    Mutation(
        "bad-record/non-utf8",
        "stepgap/io.py",
        'text = raw.decode("utf-8")',
        'text = raw.decode("utf-8", errors="replace")',
        ("tests/test_bad_input.py::test_relabel",),
    ),
    Mutation(
        "bad-record/field-named",
        "stepgap/io.py",
        "            report.add_validation(path, lineno, exc)",
        "            report.add(path, lineno, str(exc))",
        ("tests/test_bad_input.py::test_relabel",),
    ),
    Mutation(
        "empty-input/is-an-error",
        "stepgap/io.py",
        '        )\n    raise EmptyInputError(f"{path}: has no records',
        '        )\n    return\n    raise EmptyInputError(f"{path}: has no records',
        (
            "tests/cli/test_outputs.py::test_an_input_with_no_records_is_an_error_and_the_earlier_output_stays",
        ),
    ),
    Mutation(
        "output/parquet-name",
        "stepgap/io.py",
        "        if Path(path).suffix.lower() in PARQUET_SUFFIXES:\n            raise ValueError(",
        "        if False:\n            raise ValueError(",
        (
            "tests/cli/test_outputs.py::"
            "test_segment_writes_parquet_for_a_parquet_name_and_the_others_refuse_one",
        ),
    ),
    Mutation(
        "ctrl-c/ends-at-once",
        "stepgap/cli/__init__.py",
        "        os._exit(status)",
        "        sys.exit(status)",
        (
            "tests/cli/test_errors.py::"
            "test_after_ctrl_c_the_process_ends_without_the_libraries_exit_handlers",
        ),
    ),
    Mutation(
        "sigterm/as-ctrl-c",
        "stepgap/cli/__init__.py",
        "    signal.signal(signal.SIGTERM, terminated)\n",
        "",
        (
            "tests/cli/test_errors.py::"
            "test_ctrl_c_or_sigterm_is_one_line_and_the_earlier_output_is_whole",
        ),
    ),
    Mutation(
        "label/retry-keeps-old-lines",
        "teacher/label.py",
        "    try:\n        _append_verdicts(",
        "    if retry:  # the old lines dropped before the run has succeeded\n"
        "        Path(output).write_text('')\n"
        "    try:\n        _append_verdicts(",
        (
            "tests/teacher/test_label.py::"
            "test_a_rerun_that_fails_leaves_the_failed_verdicts_it_was_to_ask_again",
        ),
    ),
    Mutation(
        "stream/ends-its-judge-call",
        "teacher/stream.py",
        "            if finished or failed:",
        "            if finished:",
        (
            "tests/teacher/test_label.py::"
            "test_an_error_in_the_stream_ends_its_judge_call_before_it_is_raised",
        ),
    ),
    Mutation(
        "wrong-format/said-once",
        "stepgap/io.py",
        "        if valid or not first:\n            return",
        "        return",
        ("tests/cli/test_errors.py::test_a_traces_file_where_verdicts_go_is_said_once",),
    ),
    Mutation(
        "skipped/exit-status",
        "stepgap/cli/options.py",
        "    return EXIT_SKIPPED\n",
        "    return 0\n",
        (
            "tests/cli/test_errors.py::test_skipped_records_are_listed_once_and_exit_3_unless_allowed",
        ),
    ),
    Mutation(
        "output/replaced-on-success",
        "stepgap/io.py",
        "    partial = _partial(path)\n    _remove(partial)",
        "    partial = path\n    _remove(partial)",
        ("tests/cli/test_outputs.py",),
    ),
    Mutation(
        "reward/no-fake-reward",
        "stepgap/reward_arithmetic.py",
        '    if on_failed_check == "no_reward" and failed:',
        "    if False:",
        (
            "tests/serving/test_server_outage.py::test_a_judge_that_stops_mid_run_then_comes_back",
            "tests/serving/test_server_outage.py::test_the_trainers_own_no_reward",
            "tests/cli/test_commands.py::"
            "test_reward_gives_a_trace_with_a_failed_check_no_reward_unless_zero",
        ),
    ),
    Mutation(
        "judge/cancel-closes",
        "teacher/judges/openai_api.py",
        "        remove = deadline.on_cancel(lambda: loop.call_soon_threadsafe(task.cancel))",
        "        remove = lambda: None  # noqa: E731",
        (
            "tests/serving/test_server_outage.py::test_a_gone_clients_judge_requests_are_closed_at_once",
        ),
    ),
    Mutation(
        "server/admission-recovers",
        "serving/batching.py",
        "                expected = self.pace.estimate(ahead, cost) if ahead else None",
        "                expected = self.pace.estimate(ahead, cost)",
        ("tests/serving/test_batching.py::test_admission_recovers_once_the_server_is_idle",),
    ),
    Mutation(
        "long-trace/linear",
        "teacher/prompt.py",
        "EARLIER_EVIDENCE_CHARS = 32_000",
        "EARLIER_EVIDENCE_CHARS = 10**12",
        ("tests/test_bad_input.py::test_check_gives_every_step_of_every_good_trace_a_verdict",),
    ),
    Mutation(
        "segmenter/spans-inside",
        "stepgap/segment.py",
        "span=(step_start, step_end),",
        "span=(step_start, step_end + 1),",
        ("tests/test_segment_property.py",),
    ),
    Mutation(
        "segmenter/fake-closing-tag",
        "stepgap/segment.py",
        "            close = later",
        "            pass",
        ("tests/test_segment.py::test_a_fake_closing_tag_inside_retrieved_text_stays_evidence",),
    ),
    Mutation(
        "prompt/data-block",
        "teacher/prompt.py",
        'return text.replace("<", "\\\\u003c").replace(">", "\\\\u003e").replace("&", "\\\\u0026")',
        "return text",
        ("tests/teacher/test_prompt.py::test_adversarial_evidence_stays_inside_the_data_block",),
    ),
    Mutation(
        "view/data-block",
        "eval/view_page.py",
        'for raw, escaped in (("&", "\\\\u0026"), ("<", "\\\\u003c"), (">", "\\\\u003e")):',
        "for raw, escaped in ():",
        ("tests/eval/test_view_browser.py::test_a_script_in_the_evidence_stays_text",),
    ),
    Mutation(
        "view/text-only",
        "eval/view.js",
        "if (!hit) { span.textContent = text; return span; }",
        "if (!hit) { span.innerHTML = text; return span; }",
        ("tests/eval/test_view_browser.py::test_a_script_in_the_evidence_stays_text",),
    ),
    Mutation(
        "server/view-bounded",
        "serving/recent.py",
        "deque(maxlen=keep)",
        "deque()",
        (
            "tests/serving/test_server.py::test_view_shows_the_last_checked_traces_and_forgets_older_ones",
        ),
    ),
    Mutation(
        "server/docs-offline",
        "serving/server.py",
        "    from fastapi_offline import FastAPIOffline\n",
        "    from fastapi import FastAPI as FastAPIOffline\n",
        (
            "tests/serving/test_server.py::"
            "test_openapi_and_docs_document_every_route_and_the_examples_are_valid_requests",
        ),
    ),
    Mutation(
        "nli/special-tokens",
        "teacher/nli/hf.py",
        "        if self._specials is None:\n            return text",
        "        if True:\n            return text",
        (
            "tests/teacher/test_nli_hf.py::"
            "test_snippets_spelling_special_tokens_cannot_move_the_pair_boundary",
        ),
    ),
    Mutation(
        "nli/batch-independence",
        "teacher/nli/hf.py",
        "            return self.model(**enc).logits.float()",
        '            enc.pop("attention_mask")\n            return self.model(**enc).logits.float()',
        ("tests/teacher/test_nli_hf.py::test_an_adversarial_snippet_changes_no_other_pair",),
    ),
    Mutation(
        "nli/nfkc",
        "teacher/nli/hf.py",
        '            text = unicodedata.normalize("NFKC", text)',
        "            pass",
        (
            "tests/teacher/test_nli_hf.py::"
            "test_text_is_nfkc_normalized_as_sentencepiece_would_for_deberta_v3",
        ),
    ),
    Mutation(
        "setup/device-named",
        "stepgap/models.py",
        '    if wanted.type == "cuda":',
        "    if False:",
        (
            "tests/teacher/test_nli_hf.py::test_a_device_torch_cannot_use_is_one_line_before_any_load",
        ),
    ),
    Mutation(
        "setup/count-below-one",
        "stepgap/options.py",
        "(isinstance(value, bool) or value < 1)",
        "(isinstance(value, bool) or value < 0)",
        ("tests/cli/test_options.py::test_a_count_below_one_is_its_flags_one_line_error",),
    ),
    Mutation(
        "label/crash-safe",
        "teacher/judges/cache.py",
        "        if result.judge is None:\n            return",
        "        if True:\n            return",
        (
            "tests/teacher/test_label.py::"
            "test_sigkill_half_way_then_rerun_labels_each_step_once_and_never_asks_twice",
        ),
    ),
    Mutation(
        "judge/transient-retried",
        "teacher/judges/openai_api.py",
        "max_retries=self.max_retries,",
        "max_retries=0,",
        (
            "tests/teacher/judges/test_openai_api.py::"
            "test_each_transient_fault_is_retried_and_every_step_gets_one_verdict",
        ),
    ),
    Mutation(
        "judge/bad-credentials-stop",
        "teacher/judges/openai_api.py",
        "            except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:",
        "            except ZeroDivisionError as exc:",
        ("tests/teacher/judges/test_openai_api.py::test_bad_credentials_stop_the_run",),
    ),
    Mutation(
        "feedback/notes-not-evidence",
        "stepgap/tags.py",
        "    while (opened := _NOTE_OPEN.search(text, pos)) is not None:",
        "    while (opened := None) is not None:",
        ("tests/test_feedback.py",),
    ),
    Mutation(
        "feedback/own-tag-is-claim",
        "stepgap/tags.py",
        "    return content.strip() in _NOTE_CONTENT",
        "    return True",
        ("tests/test_feedback.py",),
    ),
    Mutation(
        "reward/failed-check-0",
        "stepgap/reward_arithmetic.py",
        'if label is None or variant == "search_only":',
        'if variant == "search_only":',
        ("tests/test_reward_arithmetic.py::test_a_failed_check_earns_nothing_and_shapes_nothing",),
    ),
    Mutation(
        "reward/bracket-range",
        "stepgap/reward_arithmetic.py",
        '"CC": 0.05}',
        '"CC": 0.5}',
        ("tests/test_reward_arithmetic.py::test_every_bracket_lies_in_the_spec_range",),
    ),
    Mutation(
        "reward/checker-fault",
        "serving/reward_function.py",
        "        except Exception as exc:  # a reward inside training must not raise\n"
        '            log.exception("checker failed on %d traces; their steps earn bracket 0", len(traces))',
        "        except ZeroDivisionError as exc:\n"
        '            log.exception("checker failed on %d traces; their steps earn bracket 0", len(traces))',
        ("tests/serving/test_reward_faults.py",),
    ),
    Mutation(
        "reward/unsegmentable",
        "serving/reward_function.py",
        "        except SegmentationError as exc:\n            self.failures",
        "        except ZeroDivisionError as exc:\n            self.failures",
        ("tests/serving/test_reward_faults.py",),
    ),
    Mutation(
        "server/503-retry-after",
        "serving/routes.py",
        'headers={"Retry-After": str(exc.retry_after)}',
        "headers={}",
        (
            "tests/serving/test_server_load.py::"
            "test_above_capacity_only_503_with_retry_after_and_the_server_survives",
        ),
    ),
    Mutation(
        "server/finalize-503-before-the-client-times-out",
        "serving/routes.py",
        "    until = clock.now() + usable_seconds(seconds)\n",
        "    until = clock.now() + seconds\n",
        (
            "tests/serving/test_server_inline.py::"
            "test_a_finalize_past_its_deadline_gets_503_with_retry_after",
        ),
    ),
    Mutation(
        "server/flat-memory",
        "serving/batching.py",
        "        works = [self._claim(t, k, costs) for t, k in zip(traces, keys, strict=True)]\n",
        "        works = [self._claim(t, k, costs) for t, k in zip(traces, keys, strict=True)]\n"
        '        self.__dict__.setdefault("kept", []).append(works)\n',
        ("tests/serving/test_server_load.py::test_64_clients_lose_nothing_and_memory_stays_flat",),
    ),
    Mutation(
        "server/hang-up-dropped",
        "serving/batching.py",
        "        gone = asyncio.ensure_future(until_gone()) if until_gone is not None else None",
        "        gone = None",
        ("tests/serving/test_server_load.py::test_64_clients_lose_nothing_and_memory_stays_flat",),
    ),
    Mutation(
        "server/no-lost-request",
        "serving/batching.py",
        "            if not future.done():\n                future.set_result(verdicts)",
        "            if not future.done() and position:\n                future.set_result(verdicts)",
        ("tests/serving/test_server_load.py::test_64_clients_lose_nothing_and_memory_stays_flat",),
    ),
    Mutation(
        "server/answer-as-finished",
        "serving/batching.py",
        "for position, verdicts in self.stream(traces, call.stop, deadlines):",
        "for position, verdicts in list(self.stream(traces, call.stop, deadlines)):",
        (
            "tests/serving/test_server_deadlines.py::"
            "test_a_trace_is_answered_when_its_own_steps_are_in_not_its_batchs",
        ),
    ),
    Mutation(
        "server/several-in-flight",
        "serving/batching.py",
        "slots = asyncio.Semaphore(self.max_inflight)",
        "slots = asyncio.Semaphore(1)",
        (
            "tests/serving/test_server_deadlines.py::test_several_checker_calls_are_in_flight_at_once",
        ),
    ),
    Mutation(
        "server/arrive-together",
        "serving/batching.py",
        "self._workers = [asyncio.create_task(self._collect())]",
        "self._workers = [asyncio.create_task(self._collect()) for _ in range(self.max_inflight)]",
        (
            "tests/serving/test_batching.py::"
            "test_traces_that_arrive_together_share_one_call_and_calls_never_exceed_max_inflight",
        ),
    ),
    Mutation(
        "nli/threads-share",
        "teacher/nli/hf.py",
        "        with self._tokenizer_lock:",
        "        if True:",
        ("tests/teacher/test_nli_hf.py::test_threads_may_share_one_backend",),
    ),
    Mutation(
        "server/deadline-503",
        "serving/batching.py",
        "            await self.clock.wait(waiting, until)",
        "            await self.clock.wait(waiting, None)",
        (
            "tests/serving/test_batching.py::"
            "test_a_call_whose_traces_are_all_dropped_stops_before_its_next_trace",
            "tests/serving/test_server_deadlines.py::"
            "test_a_request_past_its_deadline_gets_503_in_time_and_its_work_is_dropped",
            "tests/serving/test_server_deadlines.py::"
            "test_openrlhf_client_with_a_low_timeout_gets_every_reward",
        ),
    ),
    Mutation(
        "server/dropped-work-stops",
        "serving/batching.py",
        "        if all(f.done() for f in futures) and any(",
        "        if False and any(",
        (
            "tests/serving/test_server_deadlines.py::"
            "test_a_request_past_its_deadline_gets_503_in_time_and_its_work_is_dropped",
            "tests/serving/test_batching.py::"
            "test_a_call_whose_traces_are_all_dropped_stops_before_its_next_trace",
        ),
    ),
    Mutation(
        "server/kept-for-retry",
        "serving/work.py",
        "        self._keep(work)\n\n    def abandon",
        "        self.abandon(work)\n\n    def abandon",
        (
            "tests/serving/test_work.py::test_a_retry_joins_the_check_its_first_request_left_running",
            "tests/serving/test_work.py::"
            "test_a_check_that_finished_after_its_503_answers_the_retry_at_once",
        ),
    ),
    Mutation(
        "server/retry-shares",
        "serving/work.py",
        "        work = self.by_key.get(key)\n",
        "        work = None\n",
        (
            "tests/serving/test_work.py::test_a_retry_joins_the_check_its_first_request_left_running",
        ),
    ),
    Mutation(
        "server/abandoned-after-keep",
        "serving/work.py",
        "            else:\n                self.abandon(work)",
        "            else:\n                pass",
        (
            "tests/serving/test_work.py::"
            "test_work_nobody_comes_back_for_is_abandoned_after_the_keep_time",
        ),
    ),
    Mutation(
        "server/judge-down-fails-fast",
        "serving/batching.py",
        "        failed = self.works.fail_all(error)",
        "        failed = []",
        (
            "tests/serving/test_work.py::"
            "test_a_judge_that_cannot_be_reached_fails_its_work_at_once_and_is_found_again",
        ),
    ),
    Mutation(
        "server/held-while-judge-down",
        "serving/batching.py",
        '        hold_if_down = timeout is None and self.when_judge_down == "hold"',
        "        hold_if_down = False",
        (
            "tests/serving/test_work.py::"
            "test_a_request_may_be_held_while_the_judge_is_down_and_is_checked_once_it_is_back",
        ),
    ),
    Mutation(
        "server/judge-probed",
        "serving/batching.py",
        "                await asyncio.to_thread(limit.probe)",
        "                await asyncio.to_thread(lambda: False)",
        (
            "tests/serving/test_work.py::"
            "test_a_judge_that_cannot_be_reached_fails_its_work_at_once_and_is_found_again",
        ),
        timeout=120,
        hangs=True,
    ),
    Mutation(
        "judge/unreachable-reported",
        "teacher/judges/openai_wire.py",
        '                reach.unreachable(f"{type(exc).__name__}: {redact(',
        '                (lambda *_: None)(f"{type(exc).__name__}: {redact(',
        (
            "tests/teacher/judges/test_concurrency.py::"
            "test_the_judge_reports_a_server_it_cannot_reach_at_once_and_a_probe_finds_it_again",
            "tests/serving/test_server_outage.py::test_a_dead_judge_gives_no_reward_anywhere",
        ),
        timeout=180,
        hangs=True,
    ),
    Mutation(
        "judge/dropped-connection-reported",
        "teacher/judges/openai_wire.py",
        '                if not await connects(url.host, url.port or (443 if url.scheme == "https" else 80)):',
        "                if False:",
        (
            "tests/teacher/judges/test_concurrency.py::"
            "test_a_judge_server_killed_mid_request_is_reported_down_at_once",
        ),
        timeout=180,
        hangs=True,
    ),
    Mutation(
        "server/admission",
        "serving/batching.py",
        "if not down and (expected is None or expected <= 0.8 * left):",
        "if not down and (expected is None or expected <= 1e9):",
        (
            "tests/serving/test_batching.py::"
            "test_admission_refuses_at_once_what_the_measured_pace_cannot_answer_in_time",
        ),
    ),
    Mutation(
        "server/sigterm-grace",
        "serving/server.py",
        "            batcher.close_threadsafe(grace)",
        "            pass",
        (
            "tests/serving/test_server_deadlines.py::"
            "test_sigterm_answers_what_is_queued_and_exits_within_the_grace_period",
        ),
    ),
    Mutation(
        "reward/all-failed-warns",
        "serving/reward_function.py",
        "if len(failed) == len(steps) and not self._warned_all_failed:",
        "if False:",
        (
            "tests/serving/test_reward_faults.py::"
            "test_a_checker_that_fails_every_step_warns_once_at_the_first_batch_with_its_error",
        ),
    ),
    Mutation(
        "secrets/logs-cache-verdicts",
        "teacher/judges/openai_api.py",
        'failed = JudgeResult.failed(f"judge API error: {redact(str(exc))}", usage)',
        'failed = JudgeResult.failed(f"judge API error: {exc} (key {client.api_key})", usage)',
        ("tests/teacher/test_label.py::test_canary_api_key_never_reaches_logs_cache_or_verdicts",),
    ),
    Mutation(
        "secrets/bundle-card-push",
        "export/bundle.py",
        '        "prompt_version": prompt_version,',
        '        "prompt_version": prompt_version,\n'
        '        "environment": dict(__import__("os").environ),',
        ("tests/export/test_secrets.py",),
    ),
    Mutation(
        "bundle/tampered",
        "export/bundle.py",
        "        if sha256_file(file) != expected:",
        "        if False:",
        ("tests/export/test_bundle.py::test_a_tampered_file_fails_loading_naming_it",),
    ),
    Mutation(
        "bundle/pickle-refused",
        "export/bundle.py",
        "        if file.suffix in PICKLE_SUFFIXES:",
        "        if False:",
        ("tests/export/test_bundle.py::test_missing_and_pickled_files_are_refused",),
    ),
    Mutation(
        "bundle/by-id-verified",
        "export/bundle.py",
        "        if sha256_file(file) != expected:",
        "        if False:",
        ("tests/export/test_pull.py::test_a_tampered_cached_file_is_named",),
    ),
    Mutation(
        "bundle/by-id-cache-only-when-hub-down",
        "export/pull.py",
        '    return down is not None, (f"the Hub cannot be reached: {down}" if down else None)',
        "    return False, None",
        ("tests/export/test_pull.py::test_a_missing_revision_or_id_is_one_line",),
    ),
    Mutation(
        "bundle/by-id-records-commit",
        "export/pull.py",
        '        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit}',
        "        return None",
        (
            "tests/export/test_pull.py::test_a_pushed_bundle_loads_by_its_id_and_checks_as_its_folder",
        ),
    ),
    Mutation(
        "push/exact-files",
        "export/push.py",
        '    files = sorted([*manifest["files"], MANIFEST, CARD])',
        "    files = sorted(\n"
        "        [str(p.relative_to(bundle)) for p in Path(bundle).rglob('*') if p.is_file()] + [CARD]\n"
        "    )",
        ("tests/export/test_push.py::test_dry_run_lists_exactly_the_bundle_files_and_the_card",),
    ),
    # Test power: bugs that the suite's earlier fixtures could not see (a constant NLI
    # model, a student tested on its training steps, effects never asserted).
    Mutation(
        "tests/nli-label-columns",
        "teacher/nli/hf.py",
        "NLIProbs(**{lab: row[col] for lab, col in self.columns.items()})",
        "NLIProbs(**{lab: row[2 - col] for lab, col in self.columns.items()})",
        ("tests/teacher/test_nli_hf.py::test_the_stand_in_labels_its_training_pairs_by_class",),
    ),
    Mutation(
        "tests/held-out-split-leaks",
        "data_builders/sft_data.py",
        '        (held if in_eval_split(ex["trace_id"], eval_fraction, seed) else train).append(ex)',
        "        train.append(ex)\n"
        '        if in_eval_split(ex["trace_id"], eval_fraction, seed):\n'
        "            held.append(ex)",
        ("tests/student/test_train.py::test_held_out_traces_beat_the_untrained_control",),
    ),
    Mutation(
        "tests/relabel-thresholds",
        "stepgap/tree.py",
        "label=nli_label(pr, self.config.entail_threshold, self.config.contradict_threshold),",
        "label=nli_label(pr),",
        ("tests/teacher/test_relabel.py",),
    ),
    Mutation(
        "tests/augment-rate",
        "student/mining.py",
        "AUGMENT_LR_DIVISOR = 10\n",
        "AUGMENT_LR_DIVISOR = 400\n",
        ("tests/student/test_mine.py::test_cli_mine_and_augment_with_the_tiny_student",),
    ),
    Mutation(
        "tests/loss-falls",
        "student/trainer.py",
        "    args, dataset = recipe.training_args, recipe.script_args.dataset\n",
        "    args, dataset = recipe.training_args, recipe.script_args.dataset\n"
        "    args.learning_rate = 0.0\n",
        (
            "tests/student/test_train.py::test_two_processes_train_like_one_with_twice_the_batch_and_resume",
        ),
    ),
    Mutation(
        "tests/em-any-case",
        "stepgap/tags.py",
        '_OPEN_ONE = {name: re.compile(rf"<\\s*{name}\\s*>", re.IGNORECASE) for name in TAG_NAMES}',
        '_OPEN_ONE = {name: re.compile(rf"<\\s*{name}\\s*>") for name in TAG_NAMES}',
        ("tests/test_reward_arithmetic.py", "tests/test_tags.py"),
    ),
    Mutation(
        "tests/ba-contract-formula",
        "stepgap/metrics.py",
        "    return (_div(tp, tp + fn) + _div(tn, tn + fp)) / 2",
        "    return (_div(tp, tp + fn) + _div(tn, tn + fp)) / (2 if tp + fn and tn + fp else 1)",
        ("tests/test_metrics.py::test_ba_is_the_contract_formula_also_with_one_gold_class",),
    ),
    Mutation(
        "metrics/never-raise",
        "stepgap/metrics.py",
        "    return float(num) / float(den) if den else 0.0",
        "    return float(num) / float(den)",
        ("tests/test_metrics_property.py",),
    ),
]


def _dirty(files: set[str]) -> list[str]:
    out = subprocess.run(
        ["git", "status", "--porcelain", "--", *sorted(files)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line[3:] for line in out.splitlines()]


def run(mutation: Mutation) -> tuple[str, float, str]:
    """(verdict, seconds, last line of pytest's output) for one mutation."""
    path = REPO / mutation.file
    original = path.read_text(encoding="utf-8")
    if original.count(mutation.old) != 1:
        raise SystemExit(f"{mutation.promise}: the code to mutate is not found once in {path}")
    started = time.monotonic()
    try:
        path.write_text(original.replace(mutation.old, mutation.new), encoding="utf-8")
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                 "-o", f"timeout={mutation.timeout}", *mutation.tests],
                cwd=REPO, capture_output=True, text=True, timeout=mutation.timeout + 120,
            )  # fmt: skip
            verdict = _verdict(mutation, done.returncode, done.stdout)
            tail = done.stdout.strip().splitlines()[-1:]
        except subprocess.TimeoutExpired:
            verdict, tail = _verdict(mutation, None, ""), ["timed out"]
    finally:
        path.write_text(original, encoding="utf-8")
    return verdict, time.monotonic() - started, " ".join(tail)


def _verdict(mutation: Mutation, returncode: int | None, output: str) -> str:
    """caught, MISSED or TIMED OUT. Exit status 1 is "tests failed"; 2-5 (collection error,
    usage, no tests) would mean the mutation broke the run rather than the promise: missed."""
    timed_out = returncode is None or any(mark in output for mark in TIMEOUT_MARKS)
    if timed_out:
        return "caught" if mutation.hangs else "TIMED OUT"
    return "caught" if returncode == 1 else "MISSED"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="only promises whose name contains this")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if args.k in m.promise]
    dirty = _dirty({m.file for m in chosen})
    if dirty:
        raise SystemExit(f"commit or stash these first: {', '.join(dirty)}")
    uncaught = 0
    print("| promise | mutation (file) | result | seconds |")
    print("| --- | --- | --- | --- |")
    for m in chosen:
        verdict, seconds, tail = run(m)
        uncaught += verdict != "caught"
        print(f"| {m.promise} | `{m.file}` | {verdict}: {tail} | {seconds:.0f} |", flush=True)
    return 1 if uncaught else 0


if __name__ == "__main__":
    sys.exit(main())
