"""The reward service as a Ray Serve application: the routes of `stepgap serve` (`/check`,
`/reward`, OpenRLHF's `/get_reward`, slime's `/remote_rm`, `/health`) on replicas that Ray places, restarts and scales.

Each replica builds one checker from a `CheckerConfig` (sent as data, so the judge's API key
stays in the environment of the replica's process). Concurrent requests to a replica are
micro-batched by `@serve.batch` into one checker call; a checker fault becomes error verdicts
(counted in `/health`'s `failed_checks`), never a 500: their rollouts get no reward (`null` on
`/reward`, 503 on `/get_reward` and `/remote_rm`) unless `on_failed_check` is `zero`. Ray Serve's proxy
spreads requests over the replicas and replaces one that dies; a request that was on it gets a
5xx, which `RemoteChecker` and OpenRLHF's client retry.

Start it with `stepgap serve --ray` (the same checker flags as `stepgap serve`), or with
`serve run` from the shipped config (`serving/ray_serve.yaml`), whose `args` are the builder's:

    serve run stepgap.serving.ray_serve:build_app config=reward.json
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import ValidationError
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stepgap.schema import Trace, Verdict
from stepgap.teacher.build import CheckerConfig

from .api import (
    CheckRequest,
    HealthResponse,
    JudgeHealth,
    OpenRLHFRequest,
    RewardRequest,
    SlimeRequest,
    reward_response,
    rollout_traces,
    segmented_traces,
)
from .openrlhf import UnrewardedBatch, openrlhf_batch, openrlhf_response
from .reward_function import RewardOptions, RewardUnavailable
from .slime import slime_answer, slime_inputs

DEFAULT_MAX_BATCH = 32
DEFAULT_WAIT_S = 0.01


@serve.deployment(name="stepgap", max_ongoing_requests=64)
class RewardService:
    """One replica: a checker, the reward arithmetic, and a batch queue in front of them.

    The routes are dispatched here rather than by a FastAPI ingress: Serve pickles an ingress
    app, and FastAPI's telemetry state cannot be pickled. Bodies are read with the same
    pydantic models as `stepgap serve`'s."""

    def __init__(
        self,
        config: CheckerConfig,
        options: RewardOptions | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        batch_wait_s: float = DEFAULT_WAIT_S,
    ) -> None:
        from stepgap.export.offline import load_checker

        self.reward = (options or RewardOptions()).reward(load_checker(config))
        self.judge_health = JudgeHealth()
        self.check_batch.set_max_batch_size(max_batch)
        self.check_batch.set_batch_wait_timeout_s(batch_wait_s)
        self.routes = {
            ("POST", "/check"): (CheckRequest, self.check),
            ("POST", "/reward"): (RewardRequest, self.reward_route),
            ("POST", "/get_reward"): (OpenRLHFRequest, self.get_reward),
            ("POST", "/remote_rm"): (SlimeRequest, self.remote_rm),
            ("GET", "/health"): (None, self.health),
        }

    async def __call__(self, request: Request) -> Response:
        route = self.routes.get((request.method, request.url.path.rstrip("/") or "/"))
        if route is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        model, handler = route
        try:
            body = model.model_validate(await request.json()) if model else None
            answer = await handler(body) if model else await handler()
        except (ValidationError, ValueError) as exc:
            return JSONResponse({"detail": str(exc)}, status_code=422)
        except UnrewardedBatch as exc:  # OpenRLHF's "no reward": it retries, then gives None
            return JSONResponse(
                {"detail": exc.detail()}, status_code=503, headers={"Retry-After": "1"}
            )
        except RewardUnavailable as exc:  # slime's: it retries a non-2xx answer, then fails
            return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "1"})
        return JSONResponse(answer)

    @serve.batch(max_batch_size=DEFAULT_MAX_BATCH, batch_wait_timeout_s=DEFAULT_WAIT_S)
    async def check_batch(self, requests: list[list[Trace]]) -> list[list[list[Verdict]]]:
        """The traces of every request in the batch, in one checker call (in a thread, so the
        replica keeps taking requests); the answer split back per request."""
        flat = [t for traces in requests for t in traces]
        verdicts = await asyncio.to_thread(self.reward.check, flat)  # never raises
        self.judge_health.observe(verdicts)
        out, start = [], 0
        for traces in requests:
            out.append(verdicts[start : start + len(traces)])
            start += len(traces)
        return out

    async def _rewards(
        self, responses: list[str], questions: list[str], golden: list[Any], route: str
    ) -> list[Any]:
        traces = rollout_traces(self.reward, responses, questions, golden, route)
        if self.reward.variant == "search_only":
            return self.reward.score_traces(traces)
        verdicts = await self.check_batch(traces)
        return [self.reward.result(t, v) for t, v in zip(traces, verdicts, strict=True)]

    async def check(self, body: CheckRequest) -> dict[str, Any]:
        verdicts = await self.check_batch(segmented_traces(body.traces))
        return {"verdicts": [[v.model_dump(mode="json") for v in vs] for vs in verdicts]}

    async def reward_route(self, body: RewardRequest) -> dict[str, Any]:
        results = await self._rewards(body.responses, body.questions, body.golden_answers, "reward")
        return reward_response(results)

    async def get_reward(self, body: OpenRLHFRequest) -> dict[str, Any]:
        responses, questions, golden = openrlhf_batch(body.query, body.prompts, body.labels)
        return openrlhf_response(await self._rewards(responses, questions, golden, "get_reward"))

    async def remote_rm(self, body: SlimeRequest) -> float:
        inputs = slime_inputs(body.prompt, body.response, body.label)
        (result,) = await self._rewards(*([x] for x in inputs), "remote_rm")
        return slime_answer(result)

    async def health(self) -> dict[str, Any]:
        return HealthResponse(
            status=self.judge_health.status(),
            variant=self.reward.variant,
            lam=self.reward.lam,
            on_failed_check=self.reward.on_failed_check,
            queued=0,
            in_flight=0,
            failed_checks=self.reward.failures["failed_checks"],
            judge_failure=self.judge_health.failure,
        ).model_dump()


def build_app(args: dict[str, Any]) -> Any:
    """The application from `serve run`/`serve deploy` arguments (or `stepgap serve --ray`):

    - `config`: a reward configuration JSON file (`stepgap.serving.process_reward.reward_config`:
      `stepgap serve`'s checker flags by name, `variant`, `lam`), read here, on the driver;
    - `num_replicas` (default 1) or `autoscaling_config` (Ray Serve's: `min_replicas`,
      `max_replicas`, `target_ongoing_requests`, ...);
    - `ray_actor_options` per replica (`num_cpus`, `num_gpus`, `resources`);
    - `max_batch`, `batch_wait_s`: `@serve.batch`'s size and wait.
    """
    from .process_reward import reward_config

    if "config" not in args:
        raise ValueError("give config=FILE.json: the reward configuration (see `stepgap serve`)")
    config, options = reward_config(args["config"])
    return deployment(config, options, **{k: v for k, v in args.items() if k != "config"})


def deployment(
    config: CheckerConfig,
    options: RewardOptions | None = None,
    *,
    num_replicas: int | None = None,
    autoscaling_config: dict[str, Any] | None = None,
    ray_actor_options: dict[str, Any] | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    batch_wait_s: float = DEFAULT_WAIT_S,
) -> Any:
    """The bound application for a checker configuration (replicas, resources, batching)."""
    config.require_specs()
    placement: dict[str, Any] = {"ray_actor_options": ray_actor_options or {"num_cpus": 1}}
    if autoscaling_config:
        placement["autoscaling_config"] = autoscaling_config
    else:
        placement["num_replicas"] = num_replicas or 1
    return RewardService.options(**placement).bind(
        config, options or RewardOptions(), max_batch, batch_wait_s
    )
