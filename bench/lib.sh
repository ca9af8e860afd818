# Shared by bench/run and bench/profile (sourced, not run): installing what is missing, free loopback
# ports, the fixed-response upstream (nginx), redis-server and tollgate as tracked child processes,
# bounded readiness waits, and killing everything on exit.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
TOLLGATE=$CARGO_TARGET_DIR/release/tollgate
LOADGEN_BIN=$CARGO_TARGET_DIR/release/examples/loadgen
SEED_BIN=$CARGO_TARGET_DIR/release/examples/seed_poller

PIDS=()
USED_PORTS=" "
BENCH_TMP=""

die() {
  echo "bench: $*" >&2
  exit 1
}

note() {
  echo "bench: $*" >&2
}

# Kills every process this script started (by pid), then removes the temp dir.
cleanup() {
  local pid
  # TERM to all first, so they stop in parallel; then each is waited for (or killed) by stop_pid.
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    stop_pid "$pid"
  done
  if [ -n "$BENCH_TMP" ] && [ -z "${BENCH_KEEP:-}" ]; then
    rm -rf "$BENCH_TMP"
  elif [ -n "$BENCH_TMP" ]; then
    note "kept $BENCH_TMP (configs and logs)"
  fi
}

# Stops one tracked process now (and forgets it).
stop_pid() {
  local pid=$1 keep=() p
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for p in "${PIDS[@]}"; do
    [ "$p" = "$pid" ] || keep+=("$p")
  done
  PIDS=("${keep[@]}")
}

setup_tmp() {
  BENCH_TMP=$(mktemp -d /tmp/tollgate-bench.XXXXXX)
  chmod 755 "$BENCH_TMP"
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}

# Installs nginx, redis-server (with redis-cli), wrk, curl and ss (iproute2) if missing. wrk is optional: without it
# the load steps use the Rust loadgen example.
install_missing() {
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  local want=()
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || want+=(nginx)
  command -v redis-server >/dev/null 2>&1 || want+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || want+=(redis-tools)
  command -v wrk >/dev/null 2>&1 || want+=(wrk)
  command -v curl >/dev/null 2>&1 || want+=(curl)
  command -v ss >/dev/null 2>&1 || want+=(iproute2)
  [ ${#want[@]} -gt 0 ] || return 0
  note "installing ${want[*]} (Debian packages)"
  $sudo apt-get update -qq
  local pkg
  for pkg in "${want[@]}"; do
    case $pkg in
      nginx)
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx-light >/dev/null ||
          DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx >/dev/null ||
          die "cannot install nginx"
        ;;
      wrk)
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq wrk >/dev/null ||
          note "wrk is not available: the load steps use examples/loadgen.rs instead"
        ;;
      *)
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$pkg" >/dev/null ||
          die "cannot install $pkg"
        ;;
    esac
  done
}

nginx_bin() {
  command -v nginx 2>/dev/null || echo /usr/sbin/nginx
}

# free_port VAR: a loopback port nothing listens on, below the ephemeral range, not handed out before.
free_port() {
  local var=$1 p
  for _ in $(seq 1 500); do
    p=$((20000 + RANDOM % 10000))
    case "$USED_PORTS" in *" $p "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      USED_PORTS+="$p "
      printf -v "$var" '%s' "$p"
      return 0
    fi
  done
  die "no free port found"
}

# wait_http URL SECONDS: until URL answers 200.
wait_http() {
  local url=$1 secs=$2
  for _ in $(seq 1 $((secs * 10))); do
    curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null && return 0
    sleep 0.1
  done
  die "$url did not answer within ${secs}s"
}

# start_nginx UPSTREAM_PORT PROXY_PORT: one nginx, two server blocks — the fixed-response upstream
# (`return 200`) and a reverse proxy to it with upstream keepalive. Foreground, own pid and logs.
start_nginx() {
  local up=$1 proxy=$2 dir=$BENCH_TMP/nginx
  mkdir -p "$dir"
  cat >"$dir/nginx.conf" <<EOF
worker_processes $(nproc);
pid $dir/nginx.pid;
error_log $dir/error.log warn;
worker_rlimit_nofile 20000;
events { worker_connections 16384; }
http {
  access_log off;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi;
  keepalive_timeout 75s;
  keepalive_requests 10000000;
  upstream fixed {
    server 127.0.0.1:$up;
    keepalive 64;
    keepalive_requests 10000000;
  }
  # The upstream: a fixed answer, the same for every row.
  server {
    listen 127.0.0.1:$up backlog=4096;
    location / { default_type text/plain; return 200 "ok\n"; }
  }
  # The reference: nginx as a plain reverse proxy to that upstream.
  server {
    listen 127.0.0.1:$proxy backlog=4096;
    location / {
      proxy_pass http://fixed;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
  "$(nginx_bin)" -e "$dir/error.log" -c "$dir/nginx.conf" -g 'daemon off;' \
    >"$dir/stdout.log" 2>&1 &
  PIDS+=($!)
  NGINX_PID=$!
  wait_http "http://127.0.0.1:$up/" 10
  wait_http "http://127.0.0.1:$proxy/" 10
}

# start_redis PORT: a throwaway redis-server, nothing persisted.
start_redis() {
  local port=$1
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$BENCH_TMP" \
    >"$BENCH_TMP/redis.log" 2>&1 &
  PIDS+=($!)
  REDIS_PID=$!
  for _ in $(seq 1 50); do
    [ "$(redis-cli -p "$port" PING 2>/dev/null)" = "PONG" ] && return 0
    sleep 0.1
  done
  die "redis-server on port $port did not answer PING"
}

# start_tollgate NAME CONFIG_FILE ADMIN_PORT: runs tollgate on CONFIG_FILE; sets TG_PID.
start_tollgate() {
  local name=$1 config=$2 admin=$3
  RUST_LOG=${BENCH_RUST_LOG:-warn} "$TOLLGATE" run --config "$config" \
    >"$BENCH_TMP/tollgate-$name.log" 2>&1 &
  PIDS+=($!)
  TG_PID=$!
  wait_http "http://127.0.0.1:$admin/readyz" 10
}

# tollgate_config FILE LISTEN_PORT ADMIN_PORT UPSTREAM_PORT BACKEND [SERVER_TOML [PROVIDERS_TOML]]:
# the pass-through bucket `pass` plus any extra [server] keys and providers (and [store] keys from
# $STORE_EXTRA).
tollgate_config() {
  local file=$1 listen=$2 admin=$3 up=$4 backend=$5 server_extra=${6:-} extra=${7:-}
  cat >"$file" <<EOF
[server]
listen = "127.0.0.1:$listen"
admin_listen = "127.0.0.1:$admin"
shutdown_grace = "1s"
$server_extra

[store]
backend = "$backend"
url = "redis://127.0.0.1:${REDIS_PORT:-6379}/0"
${STORE_EXTRA:-}

# Pass-through: a rate far above the offered load.
[providers.pass]
upstream = "http://127.0.0.1:$up"
rate = 1000000000.0
capacity = 1000000000.0
$extra
EOF
}

build_release() {
  note "building tollgate and the bench clients (release)"
  (cd "$ROOT" && cargo build --release --locked --bin tollgate --example loadgen --example seed_poller) ||
    die "build failed"
}

# The wrk script that prints one key=value line, like `loadgen closed`.
write_wrk_report() {
  cat >"$BENCH_TMP/report.lua" <<'EOF'
done = function(summary, latency, requests)
  local e = summary.errors
  local non2xx = e.status
  io.write(string.format("requests=%d ok=%d non2xx=%d errors=%d rps=%.1f p50_us=%d p99_us=%d\n",
    summary.requests, summary.requests - non2xx, non2xx, e.connect + e.read + e.write + e.timeout,
    summary.requests / (summary.duration / 1e6), latency:percentile(50), latency:percentile(99)))
end
EOF
}

# load URL SECONDS CONNECTIONS: closed-loop load; prints the key=value line.
load() {
  local url=$1 secs=$2 conns=$3
  if command -v wrk >/dev/null 2>&1 && [ -z "${BENCH_NO_WRK:-}" ]; then
    local threads
    threads=$(nproc)
    [ "$conns" -ge "$threads" ] || threads=$conns
    timeout $((secs + 30)) wrk -t "$threads" -c "$conns" -d "${secs}s" --timeout 10s \
      -s "$BENCH_TMP/report.lua" "$url" | grep '^requests='
  else
    timeout $((secs + 30)) "$LOADGEN_BIN" closed --url "$url" --connections "$conns" \
      --duration "${secs}s"
  fi
}

# kv LINE KEY: the value of KEY in a key=value line.
kv() {
  tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p" | head -1
}

# busy_percent SECONDS: how busy the whole machine's CPUs were over SECONDS (from /proc/stat), in %.
busy_percent() {
  local secs=$1 a b
  a=$(awk '/^cpu / { print $2+$3+$4+$7+$8+$9, $5+$6 }' /proc/stat)
  sleep "$secs"
  b=$(awk '/^cpu / { print $2+$3+$4+$7+$8+$9, $5+$6 }' /proc/stat)
  awk -v a="$a" -v b="$b" 'BEGIN { split(a, x, " "); split(b, y, " ");
    busy = y[1] - x[1]; idle = y[2] - x[2]; total = busy + idle; if (total < 1) total = 1; printf "%.0f", 100 * busy / total }'
}

