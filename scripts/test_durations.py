"""Write tests/durations.json: each test file's seconds (setup + call + teardown) from a pytest
run's ``--durations=0`` report, e.g.

    bash scripts/test.sh --durations=0 2>&1 | tee /tmp/run.log
    .venv/bin/python scripts/test_durations.py /tmp/run.log

tests/conftest.py hands the files to the pytest-xdist workers longest first (with
``--dist loadfile --no-loadscope-reorder``), so the last file to start is a short one and neither
worker waits on the other at the end. The figures only order the files: stale ones cost a few
seconds of balance, never a wrong result; a file missing from them counts as its tests x the
median seconds per test.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^([0-9.]+)s (?:call|setup|teardown)\s+(\S+?)::")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: test_durations.py PYTEST_OUTPUT (a run with --durations=0)", file=sys.stderr)
        return 2
    seconds: dict[str, float] = defaultdict(float)
    for line in Path(argv[1]).read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if m:
            seconds[m.group(2)] += float(m.group(1))
    if not seconds:
        print(f"{argv[1]}: no '--durations=0' lines in it; run pytest with --durations=0", file=sys.stderr)
        return 1
    out = Path(__file__).resolve().parents[1] / "tests" / "durations.json"
    ranked = dict(sorted(((f, round(s, 1)) for f, s in seconds.items()), key=lambda kv: (-kv[1], kv[0])))
    out.write_text(json.dumps(ranked, indent=0) + "\n")
    print(f"{out}: {len(ranked)} files, {sum(ranked.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
