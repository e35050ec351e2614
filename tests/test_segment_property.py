"""Property: the segmenter never raises anything but a SegmentationError, spans stay inside."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stepgap.schema import Trace
from stepgap.segment import SegmentationError, segment_response, segment_trace

TAGS = [
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<answer>",
    "</answer>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<feedback>",
    "</feedback>",
    "< Search >",
    "</ANSWER>",
    'Doc 1(Title: "T")',
    "Doc 2(Title: (x)",
    '{"name": "search", "arguments": {"query": "q"}}',
    "\n",
    " ",
]
responses = st.lists(st.one_of(st.sampled_from(TAGS), st.text(max_size=12)), max_size=30).map(
    "".join
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(responses, st.text()))
def test_segmenter_never_raises_and_spans_lie_inside(response):
    try:
        steps = segment_response(response)
    except SegmentationError as exc:
        assert str(exc)  # a reason is always given
        return
    prev_end = 0
    for i, step in enumerate(steps):
        start, end = step.span
        assert 0 <= start <= end <= len(response)
        assert start == prev_end  # steps tile the response in order
        assert step.index == i
        prev_end = end
    assert all(s.type == "inference" for s in steps[:-1])


@settings(max_examples=200, deadline=None)
@given(responses)
def test_trace_level_segmentation_only_reports(response):
    trace = Trace(id="t", question="q", response=response)
    try:
        out = segment_trace(trace)
    except SegmentationError:
        return
    assert out.steps
