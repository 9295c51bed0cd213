"""``loadmaster lab up|down|status``: the sandbox fleet on this machine, for trying the console."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from backend.config import data_dir
from backend.errors import LoadmasterError
from backend.services import Services
from lab.process import alive
from lab.seed import CHECKPOINT_RUN, DATASET_PREFIX

if TYPE_CHECKING:  # the lab's parts load when a lab starts, not for `loadmaster --help`
    from lab.fleet import LabNodeOptions


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("lab", help="start or stop the sandbox fleet (real sshd nodes + SeaweedFS S3)")
    lsub = p.add_subparsers(dest="lab_command", metavar="ACTION", required=True)
    up = lsub.add_parser("up", help="start the sandbox and print the command that opens the console")
    up.add_argument("--nodes", type=int, default=4, help="number of sshd nodes (default 4)")
    up.add_argument("--dir", help="where the lab lives (default: <data dir>/lab)")
    up.add_argument("--no-seed", action="store_true", help="do not upload sample data and checkpoints")
    up.add_argument(
        "--postgres",
        action="store_true",
        help="also start a private PostgreSQL for the shared state ([state] url; its data outlives 'lab down'). "
        "Under root it runs as the postgres user, under /var/tmp when that user cannot reach the lab's directory",
    )
    up.add_argument(
        "--prometheus",
        action="store_true",
        help="also start the site telemetry of a real fleet: node_exporter on every node, a dcgm-exporter "
        'stand-in on the GPU nodes and a Prometheus scraping them ([telemetry] source = "auto")',
    )
    up.add_argument(
        "--alerting",
        action="store_true",
        help="also start the real Alertmanager ([alerts] alertmanager_url) and 'loadmaster watch --metrics' "
        "sending to it (with --prometheus, Prometheus scrapes the watcher's /metrics)",
    )
    up.add_argument(
        "--slurm",
        action="store_true",
        help="also start Slurm 22.05 on loopback (slurmctld + one slurmd per node, [slurm] enabled; "
        "prints SLURM_CONF so sinfo and scontrol work beside the console)",
    )
    up.set_defaults(func=lab_up)
    down = lsub.add_parser("down", help="stop everything the sandbox started")
    down.add_argument("--dir", help="the lab's directory (default: <data dir>/lab)")
    down.set_defaults(func=lab_down)
    st = lsub.add_parser("status", help="is the sandbox running, and where")
    st.add_argument("--dir", help="the lab's directory (default: <data dir>/lab)")
    st.set_defaults(func=lab_status)
    env = lsub.add_parser(
        "env",
        help="print the running sandbox's environment and the command that opens the console "
        '(eval "$(loadmaster lab env)" sets it in this shell)',
    )
    env.add_argument("--dir", help="the lab's directory (default: <data dir>/lab)")
    env.set_defaults(func=lab_env)


def _lab_dir(args: argparse.Namespace) -> Path:
    return Path(args.dir).expanduser().resolve() if args.dir else data_dir() / "lab"


def sandbox_options(n: int) -> dict[str, LabNodeOptions]:
    """A plausible training fleet: GPUs busy, one node starved, the last one in AWS us-east-1."""
    from lab.fleet import LabNodeOptions

    opts = {f"node-{i:02d}": LabNodeOptions(gpus=8, pattern="training") for i in range(1, n + 1)}
    if n >= 2:
        opts["node-02"] = LabNodeOptions(gpus=8, pattern="starved")
    if n >= 3:
        opts[f"node-{n:02d}"] = LabNodeOptions(gpus=8, pattern="training", site="aws:us-east-1")
    return opts


# The starvation window is short so the sandbox's starved node raises its alert within seconds
# of opening the console (a real fleet keeps the 60 s default).
SANDBOX_EXTRA = """
[telemetry]
starved_window = "10s"

[retention]
keep_full_latest = 2
milestone_every = 4000
"""


def lab_up(args: argparse.Namespace, services: Services) -> int:
    from lab.fleet import Lab

    root = _lab_dir(args)
    state = root / "lab.json"
    if state.exists():
        info = json.loads(state.read_text())
        if any(alive(n.get("pid")) for n in info.get("nodes", [])):
            raise LoadmasterError(f"a lab is already running in {root}; run 'loadmaster lab down' first")
    postgres = bool(getattr(args, "postgres", False))
    prometheus = bool(getattr(args, "prometheus", False))
    alerting = bool(getattr(args, "alerting", False))
    lab = Lab(
        root,
        nodes=args.nodes,
        options=sandbox_options(args.nodes),
        postgres=postgres,
        prometheus=prometheus,
        alerting=alerting,
    )
    names = (
        ["sshd nodes", "SeaweedFS S3"]
        + (["PostgreSQL"] if postgres else [])
        + (["Prometheus"] if prometheus else [])
        + (["Alertmanager"] if alerting else [])
    )
    parts = ", ".join(names[:-1]) + " and " + names[-1]
    print(f"starting {args.nodes} {parts} in {root} ...", file=sys.stderr)
    forget_previous_lab(root)
    lab.up()
    seeded: list[str] = []
    try:
        if not args.no_seed:
            assert lab.s3 is not None and lab.bucket is not None
            from lab import seed

            client = lab.s3.client()
            print("uploading a sample dataset and real DCP checkpoints ...", file=sys.stderr)
            dataset = seed.seed_dataset(client, lab.bucket)
            steps = None
            try:
                steps = seed.seed_checkpoints(client, lab.bucket)
            except ImportError:
                print(
                    "torch is not installed: skipped sample checkpoints (pip install 'loadmaster[node]')",
                    file=sys.stderr,
                )
            seeded = seed.seeded_lines(lab.bucket, dataset, steps)
        extra = SANDBOX_EXTRA
        if getattr(args, "slurm", False):
            from lab.slurm import SlurmLab

            print("starting Slurm (slurmctld + slurmd per node) ...", file=sys.stderr)
            slurm = SlurmLab(root / "slurm", [(n.name, n.ip) for n in lab.nodes]).up()
            slurm.save_state(root / "slurm.json")
            extra += slurm.config_section()
        lab.write_config(extra)
        lab.save_state()
        if alerting:
            lab.start_watch()
    except BaseException:
        from lab.slurm import SlurmLab

        SlurmLab.stop_saved(root / "slurm.json")
        lab.down()
        raise
    env = lab.env()
    if (root / "slurm.json").exists():
        env["SLURM_CONF"] = str(root / "slurm" / "slurm.conf")
    env_words = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()) if k != "LOADMASTER_CONFIG"]
    cmd = " ".join(env_words + [shlex.quote(_console_program()), "--config", shlex.quote(str(lab.config_path))])
    for n in lab.nodes:
        print(f"  {n.name}  {n.ip}:{n.port}  {lab.node_options(n.name).pattern}", file=sys.stderr)
    print(
        f"  agent   every node's $LOADMASTER_HOME/agent/venv -> {lab.agent_venv} (this console's loadmaster, "
        "run -I as on a real node)",
        file=sys.stderr,
    )
    if lab.s3:
        print(f"  s3      {lab.s3.endpoint}  bucket {lab.bucket}  (store 'lab')", file=sys.stderr)
    if lab.postgres:
        print(f"  state   {lab.postgres.url}  (password in {lab.postgres.pgpass})", file=sys.stderr)
    if lab.telemetry:
        dcgm = len(lab.telemetry.dcgm.nodes) if lab.telemetry.dcgm else 0
        print(
            f"  prometheus  {lab.telemetry.url}  (node_exporter on {len(lab.telemetry.exporters)} nodes, "
            f'dcgm-exporter stand-in on {dcgm}; [telemetry] source = "auto")',
            file=sys.stderr,
        )
    if lab.alertmanager is not None:
        print(
            f"  alerts  Alertmanager {lab.alertmanager.url} (amtool --alertmanager.url={lab.alertmanager.url} "
            f"alert query); 'loadmaster watch' sends to it, /metrics on {lab.watch_metrics}, log {root / 'watch.log'}",
            file=sys.stderr,
        )
    if seeded:
        print(
            "sample data: pull or shard the dataset (Transfers, Shards), prune the run (Checkpoints, Retention):",
            file=sys.stderr,
        )
        print("\n".join(seeded), file=sys.stderr)
    _remember_env(root, env, cmd)
    print("open the console on the sandbox with (again later: loadmaster lab env):", file=sys.stderr)
    print(cmd)
    if lab.postgres:
        second = " ".join(
            ['HOME="$(mktemp -d)"', *env_words, f"LOADMASTER_CONFIG={shlex.quote(str(lab.config_path))}"]
            + [shlex.quote(_console_program())]
        )
        print(f"a second operator on the same database, with another HOME: {second}", file=sys.stderr)
    return 0


def _console_program() -> str:
    """``loadmaster`` when that name on PATH is this installation, else this installation's full
    path (a clean clone's ``.venv/bin`` is usually not on PATH)."""
    beside = Path(sys.executable).parent / "loadmaster"
    if not beside.exists():
        return "loadmaster"
    on_path = shutil.which("loadmaster")
    return "loadmaster" if on_path and Path(on_path).resolve() == beside.resolve() else str(beside)


def lab_down(args: argparse.Namespace, services: Services) -> int:
    root = _lab_dir(args)
    state = root / "lab.json"
    if not state.exists():
        print(f"no lab is running in {root}", file=sys.stderr)
        return 0
    info = json.loads(state.read_text())
    from lab.fleet import stop_recorded

    stopped = stop_recorded(root, info)
    state.unlink()
    forgotten = forget_previous_lab(root)
    print(
        f"stopped {stopped} lab processes in {root}" + (f"; {forgotten}" if forgotten else ""),
        file=sys.stderr,
    )
    return 0


def forget_previous_lab(root: Path) -> str:
    """A new sandbox starts clean: the last lab's jobs, ledger and audit (its SQLite state) and its
    nodes' job folders are moved aside to ``state.previous`` (the one before is dropped), and the
    run folder the screens remember for the lab's config is forgotten (it names the old lab's
    bucket). What was done, as one clause."""
    done = []
    state = root / "state"
    if state.exists():
        previous = root / "state.previous"
        if previous.exists():
            shutil.rmtree(previous, ignore_errors=True)
        state.rename(previous)
        done.append(f"the lab's jobs, ledger and audit moved aside to {previous}")
    # The nodes' job folders too: a new lab's nodes would report the old lab's jobs (as foreign).
    moved = 0
    for jobs in sorted(root.glob("nodes/*/home/jobs")):
        aside = root / "state.previous" / "node-jobs" / jobs.parents[1].name
        aside.parent.mkdir(parents=True, exist_ok=True)
        if aside.exists():
            shutil.rmtree(aside, ignore_errors=True)
        jobs.rename(aside)
        moved += 1
    if moved:
        done.append(f"the job folders of {moved} node(s) moved aside")
    from backend.errors import ConfigError
    from backend.ops.prefs import forget_config, load_ui_prefs, update_ui_prefs

    # Remembered runs are keyed by the lab's identity (its bucket), so a new lab never opens on
    # the old one's; the old entries are dropped here so they do not pile up.
    prefs = load_ui_prefs()
    last = prefs.get("last_run")
    if isinstance(last, dict) and (kept := forget_config(last, str(root / "loadmaster.toml"))) != last:
        try:
            update_ui_prefs(last_run=kept)
            done.append("the screens' remembered run folder forgotten")
        except ConfigError:
            pass  # a preference file is a convenience
    return "; ".join(done)


def _remember_env(root: Path, env: dict[str, str], cmd: str) -> None:
    """Keep the environment and console command in lab.json, for ``lab env`` to print again."""
    state = root / "lab.json"
    info = json.loads(state.read_text())
    info["env"] = env
    info["console"] = cmd
    state.write_text(json.dumps(info, indent=2))


def lab_env(args: argparse.Namespace, services: Services) -> int:
    root = _lab_dir(args)
    state = root / "lab.json"
    info = json.loads(state.read_text()) if state.exists() else {}
    env = info.get("env")
    if not isinstance(env, dict) or not any(alive(n.get("pid")) for n in info.get("nodes", [])):
        raise LoadmasterError(f"no lab is running in {root}; start one with 'loadmaster lab up'")
    for key, value in sorted(env.items()):
        print(f"export {key}={shlex.quote(str(value))}")
    print(f"# open the console on the sandbox: {info.get('console', '')}")
    return 0


def lab_status(args: argparse.Namespace, services: Services) -> int:
    root = _lab_dir(args)
    state = root / "lab.json"
    if not state.exists():
        print(f"no lab in {root}")
        return 1
    info = json.loads(state.read_text())
    for n in info["nodes"]:
        print(f"{n['name']:10} {n['ip']}:{n['port']:<6} {'up' if alive(n['pid']) else 'down'}")
    print(
        f"s3         {info['s3']['endpoint']} {'up' if alive(info['s3']['pid']) else 'down'}"
        + (
            f"  bucket {info['bucket']} (s3://{info['bucket']}/{DATASET_PREFIX}/, "
            f"s3://{info['bucket']}/{CHECKPOINT_RUN}/)"
            if info.get("bucket")
            else ""
        )
    )
    pg = info.get("postgres")
    if pg:
        print(f"postgres   {pg['url']} {'up' if alive(pg['pid']) else 'down'}  pgpass {pg['pgpass']}")
    prom = info.get("prometheus")
    if prom:
        exporters = prom.get("node_exporters", [])
        exporters_up = sum(1 for e in exporters if alive(e.get("pid")))
        dcgm = prom.get("dcgm") or {}
        print(
            f"prometheus {prom['url']} {'up' if alive(prom.get('pid')) else 'down'}  "
            f"node_exporter {exporters_up}/{len(exporters)} up"
            + (
                f", dcgm-exporter stand-in ({len(dcgm.get('addresses', {}))} nodes) "
                f"{'up' if alive(dcgm.get('pid')) else 'down'}"
                if dcgm
                else ""
            )
        )
    print(f"config     {info['config']}")
    return 0
