"""Traces in, steps out: QA readers (`qa`), retrieval (`retrieval`), rollouts (`rollouts`,
`rollout_formats`, `policies`), SFT data (`sft_data`), the student target (`student_target`) and
veRL's data (`verl_data`). The data contracts, readers and the segmenter they build on live in
the root layer: `stepgap.schema`, `stepgap.io`, `stepgap.segment`."""
