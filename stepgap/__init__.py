"""stepgap: step-level evidence-gap detection for search agents, and a typed process reward.

Subpackages, from the top layer down (docs/architecture.md): `stepgap.cli` (the command),
`stepgap.serving` (the reward in training, its servers, the offline checker), `stepgap.export`
(ONNX NLI, the bundle, the Hub), `stepgap.student` (distillation, the student judge, mining),
`stepgap.eval` (reports, baselines, the view), `stepgap.data_builders` (QA sets, retrieval,
rollouts, SFT data), `stepgap.teacher` (the hybrid checker); the root modules hold the method
(`segment`, `tree`, `reward_arithmetic`, `metrics`) and what everything reads (`schema`, `io`, `tags`,
`hub_access`, `models`, `registry`, `redact`, `cluster`). Import them directly; this module stays
light so `stepgap --help` is instant.
"""

__version__ = "0.1.0"
