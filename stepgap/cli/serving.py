"""Commands of the reward: `reward` (stored traces and verdicts -> rewards) and `serve` (the
checker and the reward over HTTP)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

from stepgap.cli import Command
from stepgap.cli.options import RayServeOptions, RecordOptions, checker, finish, join_ray
from stepgap.options import at_least_one, more_than_zero, option
from stepgap.serving.reward_function import RewardOptions
from stepgap.teacher.build import CheckerConfig


@dataclass(frozen=True, kw_only=True)
class RewardArguments(RecordOptions):
    input: str = option(help="traces (raw or segmented)", positional=True)
    verdicts: str = option(help="verdicts for those traces")
    output: str = option(help="one reward line per trace (JSONL)", aliases=["-o"])
    tokenizer: str | None = option(None, "hub id or path: adds token spans (the dense form)")


def reward(args: RewardArguments, options: RewardOptions) -> int:
    from stepgap.io import ErrorReport
    from stepgap.serving.reward_function import reward_file

    report = ErrorReport()
    n = reward_file(
        args.input,
        args.verdicts,
        args.output,
        variant=options.variant,
        lam=options.lam,
        tokenizer=args.tokenizer,
        on_failed_check=options.on_failed_check,
        report=report,
    )
    return finish(args, report, n, f"rewards to {args.output}")


@dataclass(frozen=True, kw_only=True)
class ServeArguments:
    host: str = option("127.0.0.1", "bind address (default loopback only)")
    port: int = option(8000, "port")
    max_batch: int = option(32, "traces per checker call")
    max_wait_ms: float = option(10.0, "wait this long to fill a batch")
    max_queue: int = option(1024, "queued traces before 503")
    max_inflight: int | None = option(
        None,
        "checker calls running at once (default: 8 with a judge behind a URL, whose own "
        "--concurrency does the work; 1 with a model in this process)",
        metavar="N",
    )
    client_timeout: float = option(
        180.0,
        "seconds a client waits for its answer when its request has no X-Stepgap-Timeout "
        "header (OpenRLHF: 180); what cannot be answered in time gets 503 + Retry-After",
        metavar="S",
    )
    when_overloaded: Literal["hold", "refuse"] = option(
        "hold",
        "a request its deadline cannot be met for now: hold it (checked by nobody) until "
        "there is room or its time runs out, then 503 (what OpenRLHF's client, which retries "
        "blindly 1 s apart, gets the most rewards from), or refuse it 503 at once. A client "
        "that sends X-Stepgap-Timeout (stepgap's RemoteChecker) is always refused at once: it "
        "moves to another replica",
    )
    when_judge_down: Literal["refuse", "hold"] = option(
        "refuse",
        "a request while the judge's server cannot be reached: refuse it 503 + Retry-After at "
        "once, or hold it (checked by nobody) until a probe finds the judge again or its time "
        "runs out. Hold suits OpenRLHF's client, whose 5 tries 1 s apart a restart longer than "
        "5 s outlasts; a client that sends X-Stepgap-Timeout is always refused at once",
    )
    keep_for_retry: float = option(
        10.0,
        "seconds the judge's work for a request that ended unanswered (its deadline passed, "
        "its client left) goes on, for the client's retry of the same rollout to find it "
        "(OpenRLHF's retries 1 s later); 0 drops it at once",
        metavar="S",
    )
    grace: float = option(
        30.0,
        "on SIGTERM, seconds the checks in flight may finish before the rest gets 503",
        metavar="S",
    )
    max_body_mb: int = option(8, "largest request body (MB)")
    view_keep: int = option(
        100, "GET /view shows the last N checked traces (older ones are dropped)", metavar="N"
    )

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_queue", "max_inflight", "max_body_mb"):
            at_least_one(name, getattr(self, name))
        more_than_zero("client_timeout", self.client_timeout)
        if min(self.max_wait_ms, self.grace, self.view_keep, self.keep_for_retry) < 0:
            raise ValueError("max_wait_ms, grace, view_keep and keep_for_retry must be 0 or more")


def serve_on_ray(
    args: ServeArguments, options: RewardOptions, config: CheckerConfig, ray: RayServeOptions
) -> int:
    """`stepgap serve --ray`: the same routes as a Ray Serve application."""
    join_ray(ray, config)
    from ray import serve

    from stepgap.serving.ray_serve import deployment

    autoscaling = None
    if ray.ray_max_replicas:
        autoscaling = {"min_replicas": ray.ray_replicas, "max_replicas": ray.ray_max_replicas}
    app = deployment(
        config,
        options,
        num_replicas=ray.ray_replicas,
        autoscaling_config=autoscaling,
        ray_actor_options={"num_cpus": ray.ray_cpus, "num_gpus": ray.ray_gpus},
        max_batch=args.max_batch,
        batch_wait_s=args.max_wait_ms / 1000,
    )
    serve.start(http_options={"host": args.host, "port": args.port})
    print(f"stepgap serve: Ray Serve at http://{args.host}:{args.port}", file=sys.stderr)
    serve.run(app, name="stepgap", route_prefix="/", blocking=True)
    return 0


def serve(
    args: ServeArguments, options: RewardOptions, config: CheckerConfig, ray: RayServeOptions
) -> int:
    if ray.ray is not None:
        return serve_on_ray(args, options, config, ray)
    from stepgap.serving.server import serve as run_server

    run_server(
        options.reward(checker(config, online=True)),
        host=args.host,
        port=args.port,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_inflight=args.max_inflight,
        client_timeout=args.client_timeout,
        grace=args.grace,
        max_body_mb=args.max_body_mb,
        view_keep=args.view_keep,
        when_overloaded=args.when_overloaded,
        when_judge_down=args.when_judge_down,
        keep_for_retry=args.keep_for_retry,
    )
    return 0


COMMANDS = [
    Command(
        "reward",
        "typed GRPO rewards (docs/contract.md) for stored traces and verdicts",
        (RewardArguments, RewardOptions),
        reward,
    ),
    Command(
        "serve",
        "serve /check, /reward and OpenRLHF's /get_reward with micro-batching; /view",
        (ServeArguments, RewardOptions, CheckerConfig, RayServeOptions),
        serve,
    ),
]
