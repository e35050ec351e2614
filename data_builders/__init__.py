"""Traces in, steps out. The data contracts, readers and the segmenter live in the root layer
(`stepgap.schema`, `stepgap.io`, `stepgap.segment`) and are re-exported here; this folder adds
QA readers, retrieval, rollouts, SFT data and the student target."""

from stepgap.io import ErrorReport, JsonlWriter, RecordError, read_models, read_records
from stepgap.schema import (
    GAP_TYPES,
    LABELS,
    REPAIRS,
    GoldStep,
    GoldTrace,
    Judge,
    JudgeRecord,
    NLICall,
    NLIProbs,
    NLIRecord,
    Snippet,
    Step,
    Trace,
    Verdict,
)
from stepgap.segment import (
    SegmentationError,
    accumulated_evidence,
    iter_traces,
    parse_snippets,
    segment_file,
    segment_response,
    segment_trace,
)

__all__ = [
    "GAP_TYPES",
    "LABELS",
    "REPAIRS",
    "ErrorReport",
    "GoldStep",
    "GoldTrace",
    "Judge",
    "JudgeRecord",
    "JsonlWriter",
    "NLICall",
    "NLIProbs",
    "NLIRecord",
    "RecordError",
    "SegmentationError",
    "Snippet",
    "Step",
    "Trace",
    "Verdict",
    "accumulated_evidence",
    "iter_traces",
    "parse_snippets",
    "read_models",
    "read_records",
    "segment_file",
    "segment_response",
    "segment_trace",
]
