"""Commands of the reward: `reward` (stored traces and verdicts -> rewards) and `serve` (the
checker and the reward over HTTP)."""

from __future__ import annotations

import argparse
import sys

from stepgap.cli import Command
from stepgap.cli.options import (
    add_checker_options,
    add_errors_option,
    add_ray_options,
    add_reward_options,
    checker,
    checker_config,
    finish,
    join_ray,
    positive_int,
    reward_options,
)


def reward(args: argparse.Namespace) -> int:
    from stepgap.io import ErrorReport
    from stepgap.serving.reward_function import reward_file

    report = ErrorReport()
    n = reward_file(
        args.input,
        args.verdicts,
        args.output,
        variant=args.variant,
        lam=args.lam,
        tokenizer=args.tokenizer,
        report=report,
    )
    return finish(args, report, n, f"rewards to {args.output}")


def reward_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="traces (raw or segmented)")
    p.add_argument("--verdicts", required=True, help="verdicts for those traces")
    p.add_argument("-o", "--output", required=True, help="one reward line per trace (JSONL)")
    p.add_argument("--tokenizer", help="hub id or path: adds token spans (the dense form)")
    add_errors_option(p)
    add_reward_options(p, training=False)


def serve_on_ray(args: argparse.Namespace) -> int:
    """`stepgap serve --ray`: the same routes as a Ray Serve application."""
    config = checker_config(args)
    join_ray(args, config)
    from ray import serve

    from stepgap.serving.ray_serve import deployment

    autoscaling = None
    if args.ray_max_replicas:
        autoscaling = {"min_replicas": args.ray_replicas, "max_replicas": args.ray_max_replicas}
    app = deployment(
        config,
        reward_options(args),
        num_replicas=args.ray_replicas,
        autoscaling_config=autoscaling,
        ray_actor_options={"num_cpus": args.ray_cpus, "num_gpus": args.ray_gpus},
        max_batch=args.max_batch,
        batch_wait_s=args.max_wait_ms / 1000,
    )
    serve.start(http_options={"host": args.host, "port": args.port})
    print(f"stepgap serve: Ray Serve at http://{args.host}:{args.port}", file=sys.stderr)
    serve.run(app, name="stepgap", route_prefix="/", blocking=True)
    return 0


def serve(args: argparse.Namespace) -> int:
    if args.ray is not None:
        return serve_on_ray(args)
    from stepgap.serving.server import serve as run_server

    run_server(
        reward_options(args).reward(checker(args, online=True)),
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
    )
    return 0


def serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=positive_int, default=32, help="traces per checker call")
    p.add_argument("--max-wait-ms", type=float, default=10.0, help="wait this long to fill a batch")
    p.add_argument("--max-queue", type=positive_int, default=1024, help="queued traces before 503")
    p.add_argument(
        "--max-inflight",
        type=positive_int,
        metavar="N",
        help="checker calls running at once (default: 8 with a judge behind a URL, whose own "
        "--concurrency does the work; 1 with a model in this process)",
    )
    p.add_argument(
        "--client-timeout",
        type=float,
        default=180.0,
        metavar="S",
        help="seconds a client waits for its answer when its request has no X-Stepgap-Timeout "
        "header (OpenRLHF: 180); what cannot be answered in time gets 503 + Retry-After",
    )
    p.add_argument(
        "--when-overloaded",
        choices=("hold", "refuse"),
        default="hold",
        help="a request its deadline cannot be met for now: hold it (checked by nobody) until "
        "there is room or its time runs out, then 503 (what OpenRLHF's client, which retries "
        "blindly 1 s apart, gets the most rewards from), or refuse it 503 at once. A client "
        "that sends X-Stepgap-Timeout (stepgap's RemoteChecker) is always refused at once: it "
        "moves to another replica",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM, seconds the checks in flight may finish before the rest gets 503",
    )
    p.add_argument("--max-body-mb", type=positive_int, default=8, help="largest request body (MB)")
    p.add_argument(
        "--view-keep",
        type=int,
        default=100,
        metavar="N",
        help="GET /view shows the last N checked traces (older ones are dropped)",
    )
    add_reward_options(p)
    add_checker_options(p)
    add_ray_options(p, serve=True)


COMMANDS = [
    Command(
        "reward",
        "typed GRPO rewards (docs/contract.md) for stored traces and verdicts",
        reward_arguments,
        reward,
    ),
    Command(
        "serve",
        "serve /check, /reward and OpenRLHF's /get_reward with micro-batching; /view",
        serve_arguments,
        serve,
    ),
]
