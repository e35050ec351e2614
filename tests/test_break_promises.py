"""tools/break_promises.py stays usable: each mutation applies to exactly one place of its
file, and each test it names exists (code moved since a mutation was written would otherwise
make the tool refuse it, and the promise would go unchecked without anyone noticing)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location(
        "break_promises", REPO / "tools" / "break_promises.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["break_promises"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_mutation_applies_once_and_names_existing_tests():
    module = _load()
    assert len(module.MUTATIONS) >= 40
    for m in module.MUTATIONS:
        assert (REPO / m.file).read_text(encoding="utf-8").count(m.old) == 1, m.promise
        for test in m.tests:
            path, _, name = test.partition("::")
            assert (REPO / path).is_file(), (m.promise, path)
            if name:
                assert f"def {name.split('[')[0]}(" in (REPO / path).read_text(), (m.promise, test)


def test_a_time_limit_catches_only_a_promise_of_bounded_time():
    module = _load()
    hangs = next(m for m in module.MUTATIONS if m.hangs)
    plain = next(m for m in module.MUTATIONS if not m.hangs)
    out = "E   Failed: Timeout (>600.0s) from pytest-timeout.\n1 failed in 601.00s"
    assert module._verdict(hangs, 1, out) == "caught"
    assert module._verdict(plain, 1, out) == "TIMED OUT"
    assert module._verdict(plain, None, "") == "TIMED OUT"
    assert module._verdict(plain, 1, "1 failed in 3.00s") == "caught"
    assert module._verdict(plain, 0, "1 passed in 3.00s") == "MISSED"
    assert module._verdict(plain, 4, "ERROR: not found") == "MISSED"
