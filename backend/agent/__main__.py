"""The agent's entry on a node: ``python -I -m backend.agent agent run|cleanup JOBDIR`` (or ``info``).

The default agent is loadmaster in its own virtual environment on the node, its interpreter run
isolated (``-I``: no PYTHONPATH, no user site-packages, not the current directory), so neither a
training repo's own ``backend/`` package nor the training venv's packages can shadow it (see
:mod:`backend.nodes.agent`). These words stand where the ``loadmaster`` executable does, so the
leading ``agent`` word is accepted (and may be left out). Only the runner is imported: every job
start pays this process's start-up. ``info`` prints, as one JSON line, which interpreter and
environment run the agent and which loadmaster it imports (``loadmaster doctor`` reads it).
"""

from __future__ import annotations

import sys

USAGE = "usage: python -I -m backend.agent [agent] run|cleanup JOBDIR | info"


def agent_info() -> dict[str, object]:
    """Which interpreter and environment this agent runs in, and which loadmaster it imports."""
    import os

    import backend

    return {
        "python": sys.executable,
        "prefix": sys.prefix,
        "isolated": bool(sys.flags.isolated),
        "version": backend.__version__,
        "package": os.path.dirname(os.path.abspath(backend.__file__)),
        "python_version": sys.version.split()[0],
    }


def agent_main(argv: list[str]) -> int | None:
    """Run the agent action ``argv`` names (``[agent] run|cleanup JOBDIR`` or ``[agent] info``);
    None when ``argv`` is not one of them."""
    args = argv[1:] if argv[:1] == ["agent"] else argv
    if args == ["info"]:
        import json

        print(json.dumps(agent_info()))
        return 0
    if len(args) != 2 or args[0] not in ("run", "cleanup"):
        return None
    from pathlib import Path

    from backend.agent.runner import cleanup_job, run_job
    from backend.errors import LoadmasterError

    try:
        if args[0] == "run":
            return run_job(Path(args[1]))
        cleanup_job(Path(args[1]))
        return 0
    except (LoadmasterError, OSError) as exc:
        print(f"loadmaster: error: {exc}", file=sys.stderr)
        return 2


def main() -> int:
    code = agent_main(sys.argv[1:])
    if code is None:
        print(USAGE, file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
