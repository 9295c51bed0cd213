#!/usr/bin/env bash
# Install what is needed (venv, openssh-server, tmux, postgresql, prometheus, prometheus-node-exporter,
# prometheus-alertmanager, slurmctld, slurmd, slurm-client),
# run the static checks (scripts/lint.sh: ruff lint + format, import-linter, mypy; LOADMASTER_SKIP_LINT=1
# skips them) and then the full test suite against the real lab: sshd nodes on 127.0.0.x, SeaweedFS S3,
# s5cmd. Extra arguments go to pytest. Without -n it runs on as many pytest-xdist workers as the
# machine has cores (each worker starts its own lab), and says how long to expect.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source "$ROOT/scripts/bootstrap.sh" test
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || apt_install openssh-server
command -v ssh-keygen >/dev/null 2>&1 || apt_install openssh-client
command -v tmux >/dev/null 2>&1 || apt_install tmux
# The PostgreSQL server for the tests' private clusters (tests/pg_fixtures.py starts them): Debian
# keeps initdb and pg_ctl off PATH, in /usr/lib/postgresql/*/bin.
[ -x "${LOADMASTER_PG_BINDIR:-/nonexistent}/pg_ctl" ] || command -v pg_ctl >/dev/null 2>&1 \
  || compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null || apt_install postgresql
# The real Prometheus (with promtool) and node_exporter for the telemetry tests (tests/prom_fixtures.py
# starts them as plain processes on loopback; their systemd services are not used).
{ command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ]; } \
  && { command -v promtool >/dev/null 2>&1 || [ -x /usr/bin/promtool ]; } || apt_install prometheus
command -v prometheus-node-exporter >/dev/null 2>&1 || command -v node_exporter >/dev/null 2>&1 \
  || [ -x /usr/bin/prometheus-node-exporter ] || apt_install prometheus-node-exporter
# The real Alertmanager and amtool for the alerting tests (tests/am_fixtures.py starts it on loopback).
{ command -v prometheus-alertmanager >/dev/null 2>&1 || [ -x /usr/bin/prometheus-alertmanager ]; } \
  && { command -v amtool >/dev/null 2>&1 || [ -x /usr/bin/amtool ]; } || apt_install prometheus-alertmanager
# Slurm 22.05 for the Slurm tests (tests/slurm_fixtures.py runs slurmctld + slurmd on loopback).
{ command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ]; } \
  && { command -v slurmd >/dev/null 2>&1 || [ -x /usr/sbin/slurmd ]; } \
  && command -v sinfo >/dev/null 2>&1 || apt_install slurmctld slurmd slurm-client
[ "${LOADMASTER_SKIP_LINT:-0}" = 1 ] || bash "$ROOT/scripts/lint.sh"
workers_given=0
subset=0
prev=""
for arg in "$@"; do
  case "$prev $arg" in
    "-p no:xdist") workers_given=1 ;;
    "-k "*|"-m "*|"-p "*|"--dist "*|"--maxfail "*|"-W "*) ;;  # an option's value, not a test path
    *)
      case "$arg" in
        -n|-n*|--numprocesses|--numprocesses=*) workers_given=1 ;;
        -*) ;;
        *) subset=1 ;;
      esac
      ;;
  esac
  prev="$arg"
done
extra=()
if [ "$workers_given" = 0 ]; then
  workers="$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)"
  extra=(-n "$workers" --dist loadfile --no-loadscope-reorder)  # longest files first: tests/conftest.py
  # Measured 2026-12-03, quiet 2-core machine: 1,970 tests in 393 s on CI's 2 workers (~13
  # worker-minutes; 510-520 s on 2026-12-02, before the lab compiled the checkout), labs included.
  if [ "$subset" = 0 ]; then
    echo "test.sh: the full suite on $workers workers (one per core; pass -n N to choose):" \
      "expect about $(( 13 / workers + 1 )) minutes (~13 worker-minutes; slower on a loaded machine)" >&2
  else
    echo "test.sh: the chosen tests on $workers workers (one per core; pass -n 0 for one process)" >&2
  fi
fi
exec .venv/bin/python -m pytest "${extra[@]}" "$@"
