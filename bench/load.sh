#!/usr/bin/env bash
# HTTP load on the whole server: the same route served by plain Caddy, with
# rate_limit on the memory store, and with rate_limit on a standalone Redis,
# all in one run so that the ratios hold on a noisy machine.
#
#   bench/load.sh [seconds per run, default 10] [connections, default 32]
#
# Installs wrk and redis-server (Debian packages) when missing, builds
# ./caddy with xcaddy, sends traffic to 127.0.0.1 only, and stops what it
# started, by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-10}
CONNS=${2:-32}

need() {
	type -P "$1" >/dev/null && return
	local sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$2" >/dev/null
}
need wrk wrk
need redis-server redis-server

free_port() { # a port nobody listens on (checked with bash's /dev/tcp)
	local p
	while :; do
		p=$((20000 + RANDOM % 10000))
		(echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
	done
}

TMP=$(mktemp -d)
PIDS=()
cleanup() {
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$TMP"
}
trap cleanup EXIT

./xcaddy.sh build >/dev/null 2>&1 || ./xcaddy.sh build

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >"$TMP/redis.log" 2>&1 &
PIDS+=($!)

ADMIN=$(free_port) PLAIN=$(free_port) MEMORY=$(free_port) REDIS=$(free_port)
zone='zone api {
			key   {http.request.header.X-API-Key}
			rate  100000000r/s
		}'
cat >"$TMP/Caddyfile" <<CADDY
{
	admin 127.0.0.1:$ADMIN
	persist_config off
	auto_https off
	log {
		level ERROR
	}
}
http://127.0.0.1:$PLAIN {
	respond "ok"
}
http://127.0.0.1:$MEMORY {
	rate_limit {
		$zone
	}
	respond "ok"
}
http://127.0.0.1:$REDIS {
	rate_limit {
		redis {
			addresses 127.0.0.1:$REDIS_PORT
			timeout 1s
		}
		on_store_error deny
		$zone
	}
	respond "ok"
}
CADDY
HOME=$TMP XDG_DATA_HOME=$TMP XDG_CONFIG_HOME=$TMP ./caddy run --config "$TMP/Caddyfile" --adapter caddyfile >"$TMP/caddy.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$REDIS") 2>/dev/null && break; sleep 0.1; done

# 64 API keys, one per wrk connection in turn.
cat >"$TMP/keys.lua" <<'LUA'
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", { ["X-API-Key"] = "key-" .. (n % 64) })
end
LUA

run() { # name port -> "rps p50 p99"
	wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s "$TMP/keys.lua" "http://127.0.0.1:$2/" >"$TMP/$1.txt"
	local rps p50 p99 non2xx
	rps=$(awk '/Requests\/sec/ {print $2}' "$TMP/$1.txt")
	p50=$(awk '$1 == "50%" {print $2}' "$TMP/$1.txt")
	p99=$(awk '$1 == "99%" {print $2}' "$TMP/$1.txt")
	non2xx=$(awk '/Non-2xx/ {print $NF}' "$TMP/$1.txt")
	printf '%-8s %12s %10s %10s %8s\n' "$1" "$rps" "$p50" "$p99" "${non2xx:-0}"
	echo "$rps" >"$TMP/$1.rps"
}

echo "wrk -t1 -c$CONNS -d${DURATION}s, 64 API keys; caddy $(./caddy version | cut -d' ' -f1)"
printf '%-8s %12s %10s %10s %8s\n' route req/s p50 p99 non-2xx
for r in plain:$PLAIN memory:$MEMORY redis:$REDIS plain:$PLAIN; do
	run "${r%%:*}" "${r##*:}"
done
awk -v p="$(cat "$TMP/plain.rps")" -v m="$(cat "$TMP/memory.rps")" -v r="$(cat "$TMP/redis.rps")" \
	'BEGIN { printf "throughput vs plain Caddy (second plain run): memory %.2f, redis %.2f\n", m / p, r / p }'
