"""What a node prints about its jobs is untrusted: the scan parser skips hostile lines and cleans
strings, so a node cannot crash ``loadmaster jobs`` or write escape sequences to the terminal."""

from __future__ import annotations

import json

from backend.jobs.remote import parse_scan


def test_hostile_scan_lines_are_skipped_or_cleaned() -> None:
    spec = {"id": "j1", "kind": "pull", "label": "pull \x1b]0;pwned\x07\x1b[2J s3://b/x", "params": {"dest": "/d"}}
    text = "\n".join(
        [
            "@@HOME /home/u/.loadmaster/jobs",
            "@@NOW 100.5",
            "@@JOB j1",
            "@@SPEC " + json.dumps(spec),
            "@@PROG " + "[" * 100_000 + "]" * 100_000,  # RecursionError in json.loads before
            "@@PROG [1, 2, 3]",  # not an object
            "@@PROG " + json.dumps({"t": 1, "bytes_done": 5}),
            "@@RESULT " + json.dumps({"state": "failed", "error": "boom\x1b[31m red"}),
            "@@JOB j2",
            "@@SPEC " + "{" * 50_000,
        ]
    )
    home, now, jobs = parse_scan(text)
    assert (home, now) == ("/home/u/.loadmaster/jobs", 100.5)
    (j,) = jobs  # j2's spec never parsed: it is not listed as a job
    assert "\x1b" not in j.spec["label"] and "\x07" not in j.spec["label"] and j.spec["label"].endswith("s3://b/x")
    assert j.progress == [{"t": 1, "bytes_done": 5}]
    assert j.result is not None and "\x1b" not in j.result["error"]
