"""Print the requirements of an installed distribution, less those named after --without, as
a requirements file (one a line): what `make test-peers` installs beside OpenRLHF, whose
flash-attn and DeepSpeed are source builds that need CUDA (and torch before pip can read their
metadata).

    python tools/requirements_of.py openrlhf --without flash-attn deepspeed > requirements.txt
"""

from __future__ import annotations

import argparse
import importlib.metadata

from packaging.requirements import Requirement


def requirements_of(name: str, without: set[str] = frozenset()) -> list[str]:
    """`name`'s requirements (markers evaluated here, no extras) less the names in `without`."""
    kept = []
    for line in importlib.metadata.requires(name) or []:
        req = Requirement(line)
        if req.name in without or not (req.marker is None or req.marker.evaluate({"extra": ""})):
            continue
        req.marker = None
        kept.append(str(req))
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="an installed distribution, e.g. openrlhf")
    parser.add_argument("--without", nargs="*", default=[], help="requirements to leave out")
    args = parser.parse_args()
    print("\n".join(requirements_of(args.name, set(args.without))))


if __name__ == "__main__":
    main()
