#!/usr/bin/env bash
# A shared MLflow tracking server for a team: PostgreSQL backend store, artifacts served by the server.
#
# Why this shape:
# - PostgreSQL, not the local sqlite file: many clients write runs at once, from several machines.
# - `--serve-artifacts`: clients upload and download artifacts over HTTP through the server, so no
#   machine needs a shared filesystem; the files land in $DIR/artifacts on the server's machine.
# - PostgreSQL listens on a Unix socket in $DIR/run only (no TCP): the database is reachable by the
#   MLflow server on this machine and by nothing on the network.
# - Bound to 127.0.0.1 by default: MLflow has no authentication, so anyone who reaches the port can read,
#   change and delete every run. Reach it through an SSH tunnel or an authenticating reverse proxy.
# - initdb refuses to run as root: as root (CI, a shared box) PostgreSQL runs as an unprivileged user
#   ($SERVICE_USER, default `postgres`, which Debian's package creates), and so does the MLflow server when
#   that user can run the venv's Python; as a normal user (a researcher's machine) both run as that user.
#   Nothing here needs sudo.
#
# Usage:  scripts/mlflow_server.sh start|stop|status      (make mlflow-server / make mlflow-server-stop)
#   HOST, PORT            where the server listens (default 127.0.0.1:5000; a warning when not loopback)
#   MLFLOW_SERVER_DIR     its data: PostgreSQL cluster (pg/), socket (run/), artifacts/, logs/
#                         (default data/mlflow-server, git-ignored; under WORKBENCH_DATA_DIR when set)
#   PG_PORT               names PostgreSQL's socket file (default 5432; no TCP port is opened)
#   WORKERS               server worker processes (default 2)
#   SERVICE_USER          the unprivileged user when run as root (default postgres)
#   MLFLOW                the mlflow command (default .venv/bin/mlflow; its Python needs psycopg, the `team` extra)
#   MLFLOW_SERVER_ARGS    extra `mlflow server` flags, e.g. "--allowed-hosts mlflow.lab:5000" when clients
#                         use a host name (MLflow's default allows localhost and private IPs only)
# Idempotent: initdb once, then start whatever is not running; `stop` stops both.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-5000}"
DIR="${MLFLOW_SERVER_DIR:-${WORKBENCH_DATA_DIR:-${ROOT}/data}/mlflow-server}"
PG_PORT="${PG_PORT:-5432}"
WORKERS="${WORKERS:-2}"
MLFLOW="${MLFLOW:-${ROOT}/.venv/bin/mlflow}"
DB_USER="mlflow"
DB_NAME="mlflow"

die() { echo "mlflow-server: $*" >&2; exit 1; }
say() { echo "mlflow-server: $*" >&2; }

DIR="$(realpath -m "$DIR")"  # absolute: PostgreSQL and the server get it from another working folder
PGDATA="$DIR/pg"
SOCK="$DIR/run"
ARTIFACTS="$DIR/artifacts"
LOGS="$DIR/logs"
PIDFILE="$DIR/mlflow.pid"

if [[ "$(id -u)" == 0 ]]; then
  SERVICE_USER="${SERVICE_USER:-postgres}"
  id "$SERVICE_USER" >/dev/null 2>&1 \
    || die "running as root, and PostgreSQL refuses to: create an unprivileged user (useradd --system $SERVICE_USER) or set SERVICE_USER"
  as_svc() { runuser -u "$SERVICE_USER" -- "$@"; }
else
  as_svc() { "$@"; }
fi

pg_bin() {
  # PATH first, then Debian's versioned folder (the newest), which the postgresql package does not put on PATH
  local name="$1" d
  if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return; fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [[ -x "$d/$name" ]] && { echo "$d/$name"; return; }
  done
  die "no PostgreSQL ($name) found: install it (Debian: apt-get install -y postgresql)"
}

py() { "$(dirname "$MLFLOW")/python" "$@"; }

url() {  # where a client on this machine reaches the server (a wildcard bind is reachable on loopback)
  local h="$HOST"
  [[ "$h" == "0.0.0.0" || "$h" == "::" || "$h" == "" ]] && h="127.0.0.1"
  [[ "$h" == *:* ]] && h="[$h]"
  echo "http://$h:$PORT"
}

healthy() {  # the server at $1 (default: HOST:PORT) answers /health
  py -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/health", timeout=2)' "${1:-$(url)}" 2>/dev/null
}

mlflow_running() { [[ -f "$PIDFILE" ]] && kill -0 -- "-$(cat "$PIDFILE")" 2>/dev/null; }

pg_running() { [[ -f "$PGDATA/PG_VERSION" ]] && as_svc "$(pg_bin pg_ctl)" -D "$PGDATA" status >/dev/null 2>&1; }

preflight() {  # what the server needs, checked before anything starts
  [[ -x "$MLFLOW" ]] || die "no $MLFLOW: run make setup (or set MLFLOW)"
  py -c "import psycopg" 2>/dev/null \
    || die "MLflow's Python has no PostgreSQL driver: .venv/bin/pip install -e '.[team]' (make mlflow-server does)"
  pg_bin initdb >/dev/null
}

start_postgres() {
  if [[ ! -f "$PGDATA/PG_VERSION" ]]; then
    say "initdb $PGDATA (once)"
    if [[ "$(id -u)" == 0 ]]; then
      chown "$SERVICE_USER" "$DIR"
      as_svc test -w "$DIR" || die "$SERVICE_USER cannot write $DIR (a parent folder closed to it?): set MLFLOW_SERVER_DIR"
    fi
    chmod 700 "$DIR"
    as_svc "$(pg_bin initdb)" -D "$PGDATA" -U "$DB_USER" --auth=trust -E UTF8 >/dev/null
    # socket, port and no TCP come from workbench.conf, rewritten at every start (PG_PORT, DIR may change)
    echo "include_if_exists = 'workbench.conf'" | as_svc tee -a "$PGDATA/postgresql.conf" >/dev/null
  fi
  as_svc mkdir -p "$SOCK" "$LOGS" "$ARTIFACTS"
  printf "listen_addresses = ''\nunix_socket_directories = '%s'\nunix_socket_permissions = 0700\nport = %s\n" \
    "$SOCK" "$PG_PORT" | as_svc tee "$PGDATA/workbench.conf" >/dev/null
  if pg_running; then
    say "PostgreSQL already running ($PGDATA)"
  else
    as_svc "$(pg_bin pg_ctl)" -D "$PGDATA" -l "$LOGS/postgres.log" -w -t 60 start >/dev/null \
      || die "PostgreSQL did not start; see $LOGS/postgres.log"
  fi
  local psql; psql="$(pg_bin psql)"
  if [[ "$(as_svc "$psql" -h "$SOCK" -p "$PG_PORT" -U "$DB_USER" -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" != 1 ]]; then
    as_svc "$psql" -h "$SOCK" -p "$PG_PORT" -U "$DB_USER" -d postgres -qc "CREATE DATABASE $DB_NAME" >/dev/null
  fi
}

started_url() { cat "$DIR/mlflow.url" 2>/dev/null || url; }  # where our server was started (status, restarts)

wait_healthy() {  # until /health answers; fails when the server's process group is gone
  local i u; u="$(started_url)"
  for i in $(seq 1 180); do
    healthy "$u" && { say "MLflow server at $u (store: PostgreSQL in $PGDATA, artifacts: $ARTIFACTS)"; return; }
    mlflow_running || die "the MLflow server exited; see $LOGS/mlflow.log"
    sleep 1
  done
  die "the MLflow server did not answer $u/health within 180 s; see $LOGS/mlflow.log"
}

start_mlflow() {
  if mlflow_running; then  # ours, running or still starting: never a second one on the same pid file
    say "MLflow server already started"
    wait_healthy
    return
  fi
  healthy && die "something else answers at $(url): stop it or choose another PORT"
  local store="postgresql+psycopg://$DB_USER@/$DB_NAME?host=$SOCK&port=$PG_PORT" user=()
  if [[ "$(id -u)" == 0 ]]; then  # an unauthenticated web server had better not run as root
    if as_svc "$(dirname "$MLFLOW")/python" -c "import mlflow" 2>/dev/null; then
      user=(runuser -u "$SERVICE_USER" --)
    else
      say "note: $SERVICE_USER cannot run $MLFLOW (its Python sits in a folder closed to it), so the server runs as root"
    fi
  fi
  # setsid: the server and its workers are one process group (pid = $!), which `stop` ends as a whole;
  # MLFLOW_SERVER_ENABLE_JOB_EXECUTION: MLflow's GenAI job runner (7 more processes) is unused by the workbench
  # shellcheck disable=SC2086 # MLFLOW_SERVER_ARGS is a list of flags
  MLFLOW_DISABLE_TELEMETRY=true MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}" \
    setsid "${user[@]}" \
    "$MLFLOW" server --backend-store-uri "$store" --serve-artifacts --artifacts-destination "$ARTIFACTS" \
    --host "$HOST" --port "$PORT" --workers "$WORKERS" ${MLFLOW_SERVER_ARGS:-} \
    >>"$LOGS/mlflow.log" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  url >"$DIR/mlflow.url"  # for `status`, which is run without HOST/PORT
  wait_healthy
}

stop_all() {
  if [[ -f "$PIDFILE" ]]; then
    local pg i; pg="$(cat "$PIDFILE")"
    if kill -TERM -- "-$pg" 2>/dev/null; then
      for i in $(seq 1 30); do kill -0 -- "-$pg" 2>/dev/null || break; sleep 0.5; done
      kill -KILL -- "-$pg" 2>/dev/null || true
      say "MLflow server stopped"
    fi
    rm -f "$PIDFILE" "$DIR/mlflow.url"
  fi
  if pg_running; then
    as_svc "$(pg_bin pg_ctl)" -D "$PGDATA" -m fast -w stop >/dev/null
    say "PostgreSQL stopped"
  fi
}

case "${1:-}" in
  start)
    mkdir -p "$DIR"
    case "$HOST" in
      127.*|localhost|::1) ;;
      *) say "WARNING: binding $HOST:$PORT. MLflow has no authentication: anyone who reaches this port can read," \
             "change and delete every run and artifact. Prefer HOST=127.0.0.1 with an SSH tunnel, or an" \
             "authenticating reverse proxy in front." ;;
    esac
    preflight
    start_postgres
    start_mlflow
    echo "export MLFLOW_TRACKING_URI=$(started_url)"
    ;;
  stop) stop_all ;;
  status)
    pg_running && say "PostgreSQL: running ($PGDATA)" || say "PostgreSQL: stopped"
    if mlflow_running && healthy "$(started_url)"; then say "MLflow server: running at $(started_url)"
    else say "MLflow server: not running"; fi
    ;;
  *) die "usage: $0 start|stop|status" ;;
esac
