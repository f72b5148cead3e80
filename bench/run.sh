#!/usr/bin/env bash
# The whole comparison in one command: starts a private PostgreSQL and a
# private Redis on 127.0.0.1, runs the harness against them beside the
# embedded systems, and stops both again. Arguments go to the harness:
#
#   bench/run.sh -duration 3s -conc 1,16,64 -out results
#
# Missing servers are installed with apt-get when running as root. A server
# that cannot be installed or started is left out of the run with a message;
# the others are still measured. The servers' data live in a temporary
# directory beside the current one (on the same disk as the embedded
# stores, so every system syncs to the same device), removed at the end.
# PG_PORT and REDIS_PORT choose the ports (default 55432 and 56379).
# PG_STANDBY=sync adds a streaming standby on PG_PORT+1, made with
# pg_basebackup and named in synchronous_standby_names, so that every
# PostgreSQL commit waits for it: the postgres and pgstore rows then measure
# a primary with a synchronous standby.
set -euo pipefail

cd "$(dirname "$0")/.."

pg_port=${PG_PORT:-55432}
redis_port=${REDIS_PORT:-56379}
systems=idem,idem-http,pebble,pebble-tuned,disk
harness_args=()

tmp=$(mktemp -d "$PWD/idem-bench-servers.XXXXXX")
# PostgreSQL may run as another user, who must reach its directory.
chmod 755 "$tmp"
pg_pid=""
standby_pid=""
redis_pid=""

say() { echo "run.sh: $*" >&2; }

# stop_pid sends a signal to one process we started and waits up to 30 s
# for it to go. The servers are not children of this shell (pg_ctl
# detaches PostgreSQL), so wait is not available: poll instead.
stop_pid() {
  local pid=$1 sig=$2
  kill "-$sig" "$pid" 2>/dev/null || return 0
  for _ in $(seq 300); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  say "process $pid did not stop after SIG$sig; killing it"
  kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
  # Fast shutdown for PostgreSQL (SIGINT): it rolls back open sessions and
  # stops cleanly; SIGTERM would wait for clients to leave.
  if [ -n "$standby_pid" ]; then stop_pid "$standby_pid" INT; fi
  if [ -n "$pg_pid" ]; then stop_pid "$pg_pid" INT; fi
  if [ -n "$redis_pid" ]; then stop_pid "$redis_pid" TERM; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# need_apt installs the Debian packages given when any of them is missing
# and we are root, updating the package lists once. It fails quietly, so
# the caller can skip the system.
apt_updated=no
need_apt() {
  if [ "$(id -u)" != 0 ]; then
    say "not root, so not installing $*"
    return 1
  fi
  if [ "$apt_updated" = no ]; then
    apt-get update -qq >"$tmp/apt.log" 2>&1 || { say "apt-get update failed (see below)"; tail -5 "$tmp/apt.log" >&2; return 1; }
    apt_updated=yes
  fi
  say "installing $* with apt-get"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >>"$tmp/apt.log" 2>&1 ||
    { say "apt-get install $* failed"; tail -5 "$tmp/apt.log" >&2; return 1; }
}

# pg_bindir finds the newest PostgreSQL server binaries: on PATH, or where
# Debian keeps them (/usr/lib/postgresql/N/bin), which is not on PATH.
pg_bindir() {
  if command -v initdb >/dev/null && command -v pg_ctl >/dev/null && command -v postgres >/dev/null; then
    dirname "$(readlink -f "$(command -v postgres)")" # a link's target holds the other tools
    return
  fi
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n | tail -1)
  [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

start_postgres() {
  local bin ver
  bin=$(pg_bindir) || true
  if [ -z "$bin" ]; then
    need_apt postgresql || return 1
    bin=$(pg_bindir) || true
    [ -n "$bin" ] || { say "no PostgreSQL binaries after installing"; return 1; }
  fi
  ver=$("$bin/postgres" --version | sed -E 's/[^0-9]*([0-9]+).*/\1/')
  if [ "$ver" -lt 15 ]; then
    say "PostgreSQL $ver is older than 15"
    return 1
  fi

  local dir=$tmp/pg
  mkdir -p "$dir"
  # PostgreSQL refuses to run as root: run it as the postgres user, made
  # here if the package did not make it.
  local as=()
  if [ "$(id -u)" = 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
      useradd --system --no-create-home --shell /usr/sbin/nologin postgres || { say "cannot create a postgres user"; return 1; }
    fi
    chown postgres "$dir"
    as=(runuser -u postgres --)
  fi
  # Trust on a loopback-only, private-port, throwaway cluster: nothing but
  # this machine can reach it, and it is gone when the run ends.
  if ! "${as[@]}" "$bin/initdb" -D "$dir/data" -U bench --auth=trust -E UTF8 --no-instructions >"$dir/initdb.log" 2>&1; then
    say "initdb failed"; tail -5 "$dir/initdb.log" >&2; return 1
  fi
  # fsync and synchronous_commit are on (the defaults, stated so a reader
  # sees it): every commit is durable before it answers.
  if ! "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 start -o \
    "-c listen_addresses=127.0.0.1 -p $pg_port -c unix_socket_directories=$dir -c fsync=on -c synchronous_commit=on -c max_connections=500 -c shared_buffers=256MB" \
    >"$dir/pg_ctl.log" 2>&1; then
    say "PostgreSQL did not start"; tail -5 "$dir/log" >&2 || true
    # It may be up but late: stop it too.
    if [ -f "$dir/data/postmaster.pid" ]; then pg_pid=$(head -1 "$dir/data/postmaster.pid"); fi
    return 1
  fi
  pg_pid=$(head -1 "$dir/data/postmaster.pid")
  say "PostgreSQL $ver started on 127.0.0.1:$pg_port (pid $pg_pid)"
  if [ "${PG_STANDBY:-}" = sync ]; then
    start_standby "$bin" || return 1
  fi
}

# start_standby makes a standby of the cluster start_postgres started and
# waits until the primary counts it as its synchronous standby.
start_standby() {
  local bin=$1 dir=$tmp/pg port=$((pg_port + 1))
  if ! "${as[@]}" "$bin/pg_basebackup" -h 127.0.0.1 -p "$pg_port" -U bench -D "$dir/standby" -X stream -R \
    --checkpoint=fast >"$dir/basebackup.log" 2>&1; then
    say "pg_basebackup failed"; tail -5 "$dir/basebackup.log" >&2; return 1
  fi
  if ! "${as[@]}" "$bin/pg_ctl" -D "$dir/standby" -l "$dir/standby.log" -w -t 60 start -o \
    "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$dir -c max_connections=500 -c shared_buffers=256MB -c primary_conninfo='host=127.0.0.1 port=$pg_port user=bench application_name=bench_standby'" \
    >"$dir/pg_ctl-standby.log" 2>&1; then
    say "the standby did not start"; tail -5 "$dir/standby.log" >&2 || true; return 1
  fi
  standby_pid=$(head -1 "$dir/standby/postmaster.pid")
  local psql=("${as[@]}" "$bin/psql" -h 127.0.0.1 -p "$pg_port" -U bench -d postgres -qAtc)
  "${psql[@]}" "ALTER SYSTEM SET synchronous_standby_names = 'bench_standby'" >/dev/null &&
    "${psql[@]}" "SELECT pg_reload_conf()" >/dev/null || return 1
  for _ in $(seq 300); do
    if [ "$("${psql[@]}" "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")" = 1 ]; then
      say "synchronous standby started on 127.0.0.1:$port (pid $standby_pid)"
      return 0
    fi
    sleep 0.1
  done
  say "the standby did not become synchronous in 30 s"
  return 1
}

start_redis() {
  if ! command -v redis-server >/dev/null; then
    need_apt redis-server || return 1
  fi
  local dir=$tmp/redis
  mkdir -p "$dir"
  redis-server --bind 127.0.0.1 --port "$redis_port" --protected-mode yes \
    --appendonly yes --appendfsync always --dir "$dir" --save '' \
    --daemonize no --logfile "$dir/log" &
  redis_pid=$!
  for _ in $(seq 100); do
    if ! kill -0 "$redis_pid" 2>/dev/null; then
      redis_pid=""
      say "Redis did not start"; tail -5 "$dir/log" >&2 || true; return 1
    fi
    # The harness checks the fsync policy itself; here only: does it answer?
    if (exec 3<>"/dev/tcp/127.0.0.1/$redis_port" && printf 'PING\r\n' >&3 && read -r -t 1 line <&3 && [ "${line%$'\r'}" = +PONG ]) 2>/dev/null; then
      say "Redis $(redis-server --version | sed -E 's/.*v=([^ ]+).*/\1/') started on 127.0.0.1:$redis_port (pid $redis_pid)"
      return 0
    fi
    sleep 0.1
  done
  say "Redis did not answer in 10 s"
  return 1
}

if start_postgres; then
  systems+=,postgres,pgstore
  harness_args+=(-pg "postgres://bench@127.0.0.1:$pg_port/postgres?sslmode=disable")
else
  say "skipping postgres and pgstore"
fi
if start_redis; then
  systems+=,redis
  harness_args+=(-redis "127.0.0.1:$redis_port")
else
  say "skipping redis"
fi

# The caller's own -systems, given later, wins over this one.
go run ./bench -systems "$systems" "${harness_args[@]}" "$@"
