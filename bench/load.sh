#!/usr/bin/env bash
# HTTP load on the whole server: the same `respond` route served by plain
# Caddy and behind rate_limit on every store, in one run, so that the ratios
# hold on a noisy machine.
#
#   bench/load.sh [seconds per run, default 5] [reps, default 3] [connections, default 64]
#
# Besides req/s and p99, each run reports the CPU time Caddy and the Redis
# servers it uses (masters and replicas) spent per request, from /proc and
# INFO cpu (less what those servers spend idle, measured before the reps):
# the figures of the README's capacity plan. For the routes that
# sync, it also reports the sync rounds of the run by result and the
# buckets they charged (caddy_rate_limit_syncs_total and synced_keys_total
# from Caddy's /metrics), and says so loudly when a round failed or none
# ran: a figure of a route whose rounds fail does not measure sync. A
# synced zone costs Redis per bucket a round charges, not per request, so
# it also reports the Redis CPU per bucket charged and the requests each
# carried: µs per request is their quotient, and follows the traffic's
# shape (requests per key and round) as much as the code.
#
# Routes: plain; memory (allowed, allowed with headers none, refused);
# standalone Redis (64 keys);
# Redis Cluster of 3 masters (one key, 10,000 keys, 10,000 keys in a zone
# that syncs every 100ms far under its limit, the same near it, refused);
# and
# mholt/caddy-ratelimit (allowed, refused: its own Caddy, of the same
# version), built as its users build it (xcaddy build --with
# github.com/mholt/caddy-ratelimit), else with ../shared/peers/build-caddy-ratelimit.sh
# (its source, where the module proxy does not serve it), or taken from
# $CRL_CADDY; when it cannot be built, the script says so and
# compares with plain Caddy only. Each rep runs
# every route once (interleaved: plain, then each route), with
# `wrk -t2 -c<connections>`; the ratio to plain is computed per rep (against
# that rep's plain run) and the median is reported. Then a constant-rate
# run (vegeta) at a half, a quarter and an eighth of plain's peak gives the p99 of
# plain and of the cluster route.
#
# cluster_10k_global is cluster_10k's zone made global, with the
# standalone Redis as the one peer region (no latency between them): the
# request path of a global zone against the zone's, and what the exchange
# costs: the peer's commands and CPU per request, and the exchanges of the
# run by result (it says so loudly when one failed or none ran).
#
# ONLY="<route> ..." measures plain and those routes alone (all of them are
# still served).
#
# RATE=<req/s> offers every route about that rate (each connection waits
# connections × 1000 / RATE ms after each answer) instead of as many as
# it answers: routes compared at one rate, when each keeps up, cost what
# their requests cost, not what a busier or idler machine does per
# request (a closed loop's rate differs by route, and the CPU a request
# costs Caddy with it: fewer wake-ups a request at a higher rate).
#
# OTHER_CADDY=<binary> also serves the measured routes from that Caddy
# (built from another commit, say), as <route>@other, run right after
# each route in every rep: a before/after in one run. Set ONLY to routes
# both binaries understand.
#
# PROFILE=<route> also takes a CPU profile of Caddy (from its admin
# endpoint's /debug/pprof/) during that route's first run, and writes it to
# bench/<route>.pprof (read it with `go tool pprof -top caddy bench/<route>.pprof`).
#
# Installs wrk and redis-server (Debian packages) and vegeta (go install)
# when missing, builds ./caddy with xcaddy, sends traffic to 127.0.0.1
# only, and stops what it started, by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-5}
RATE=${RATE:-}
REPS=${2:-3}
CONNS=${3:-64}
DELAY=0 # ms each connection waits after an answer: RATE's offered rate
[ -z "$RATE" ] || DELAY=$(awk -v c="$CONNS" -v r="$RATE" 'BEGIN { d = int(c * 1000 / r + 0.5); print (d < 1 ? 1 : d) }')
VEGETA_VERSION=v12.12.0

need() {
	type -P "$1" >/dev/null && return
	local sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$2" >/dev/null
}
need wrk wrk
need redis-server redis-server
VEGETA=$(type -P vegeta || echo "$(go env GOPATH)/bin/vegeta")
[ -x "$VEGETA" ] || go install "github.com/tsenart/vegeta/v12@$VEGETA_VERSION"

TAKEN=" " # the ports free_port handed out: two routes never get one port
free_port() { # FREE= a port nobody listens on (checked with bash's /dev/tcp), not handed out before
	local p
	while :; do
		p=$((20000 + RANDOM % 10000))
		[[ $TAKEN == *" $p "* ]] && continue
		(echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { TAKEN+="$p "; FREE=$p; return; }
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
CADDY_VERSION=$(./caddy version | cut -d' ' -f1)

# mholt/caddy-ratelimit, the module this one is compared with.
CRL_CADDY=${CRL_CADDY:-}
if [ -z "$CRL_CADDY" ]; then
	XCADDY=$(type -P xcaddy || echo "$(go env GOPATH)/bin/xcaddy")
	PEERS=../shared/peers/build-caddy-ratelimit.sh # its source, where the module proxy does not serve it
	if (cd "$TMP" && "$XCADDY" build "$CADDY_VERSION" --with github.com/mholt/caddy-ratelimit --output "$TMP/caddy-crl") >"$TMP/crl-build.log" 2>&1; then
		CRL_CADDY=$TMP/caddy-crl
	elif [ -x "$PEERS" ] && "$PEERS" "$TMP/caddy-crl" >>"$TMP/crl-build.log" 2>&1; then
		CRL_CADDY=$TMP/caddy-crl
	else
		echo "mholt/caddy-ratelimit: not built, compared with plain Caddy only: $(grep -m1 -iE 'forbidden|not available|error|fatal' "$TMP/crl-build.log" || tail -1 "$TMP/crl-build.log")"
	fi
fi

# A standalone Redis and a cluster of 3 masters with a replica each.
go build -o "$TMP/redisfleet" ./internal/redistest/redisfleet
mkdir -p "$TMP/redis"
"$TMP/redisfleet" -env "$TMP/redis.env" -dir "$TMP/redis" >"$TMP/redisfleet.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 300); do [ -f "$TMP/redis.env" ] && break; sleep 0.1; done
# shellcheck disable=SC1091
source "$TMP/redis.env"
CLUSTER=${RL_REDIS_CLUSTER//,/ }

free_port
ADMIN=$FREE
declare -A PORT
ROUTES=(plain memory memory_noheaders memory_refused standalone cluster_1key cluster_10k cluster_10k_global cluster_10k_sync cluster_10k_sync_near cluster_refused)
[ -z "$CRL_CADDY" ] || ROUTES+=(crl crl_refused)

for r in "${ROUTES[@]}"; do
	free_port
	PORT[$r]=$FREE
done
MEASURED=("${ROUTES[@]}")
if [ -n "${ONLY:-}" ]; then # ONLY="route ..." measures plain and those routes alone
	read -ra only <<<"$ONLY"
	MEASURED=(plain "${only[@]}")
fi
OTHER_CADDY=${OTHER_CADDY:-}
if [ -n "$OTHER_CADDY" ]; then # each measured route, then the same from the other Caddy
	both=()
	for r in "${MEASURED[@]}"; do
		free_port
		PORT[$r@other]=$FREE
		both+=("$r" "$r@other")
	done
	OTHER_ROUTES=("${MEASURED[@]}")
	MEASURED=("${both[@]}")
fi
# A zone of each route's own name: zones of one name share their buckets.
open() { printf 'zone %s {\n\t\t\tkey   {http.request.header.X-API-Key}\n\t\t\trate  100000000r/s\n\t\t}' "$1"; }
synced() { printf 'zone %s {\n\t\t\tkey   {http.request.header.X-API-Key}\n\t\t\trate  %s\n\t\t\tsync  100ms\n\t\t}' "$1" "$2"; }
closed() { printf 'zone %s {\n\t\t\tkey   {http.request.header.X-API-Key}\n\t\t\trate  1r/h\n\t\t\tburst 1\n\t\t}' "$1"; }
global() { printf 'zone %s {\n\t\t\tkey   {http.request.header.X-API-Key}\n\t\t\trate  100000000r/s\n\t\t\tglobal\n\t\t}' "$1"; }
regions() { printf 'regions eu {\n\t\t\tus {\n\t\t\t\taddresses %s\n\t\t\t}\n\t\t\tsync 1s\n\t\t}\n\t\t%s' "$RL_REDIS_STANDALONE" "$1"; }
SUFFIX="" # the routes' port suffix: "" for this Caddy, "@other" for OTHER_CADDY
site() { # name, rate_limit body
	[ -n "${PORT[$1$SUFFIX]:-}" ] || return 0
	printf 'http://127.0.0.1:%s {\n\trate_limit {\n\t\t%s\n\t}\n\trespond "ok"\n}\n' "${PORT[$1$SUFFIX]}" "$2"
}
redis() { printf 'redis {\n\t\t\taddresses %s\n\t\t\ttimeout 1s\n\t\t}\n\t\ton_store_error deny\n\t\t%s' "$1" "$2"; }
caddyfile() { # admin port: every route whose port of $SUFFIX is set
	printf '{\n\tadmin 127.0.0.1:%s\n\tpersist_config off\n\tauto_https off\n\tlog {\n\t\tlevel ERROR\n\t}\n}\n' "$1"
	printf 'http://127.0.0.1:%s {\n\trespond "ok"\n}\n' "${PORT[plain$SUFFIX]}"
	site memory "$(open memory)"
	site memory_noheaders "headers none
		$(open memory_noheaders)"
	site memory_refused "$(closed memory_refused)"
	site standalone "$(redis "$RL_REDIS_STANDALONE" "$(open standalone)")"
	site cluster_1key "$(redis "$CLUSTER" "$(open cluster_1key)")"
	site cluster_10k "$(redis "$CLUSTER" "$(open cluster_10k)")"
	site cluster_10k_global "$(redis "$CLUSTER" "$(regions "$(global cluster_10k_global)")")"
	site cluster_10k_sync "$(redis "$CLUSTER" "$(synced cluster_10k_sync 100000000r/s)")"
	# Each key is sent about 1.5 requests a second: of 4 a second, an
	# instance spends half its share in about a second, and is charged.
	site cluster_10k_sync_near "$(redis "$CLUSTER" "$(synced cluster_10k_sync_near 4r/s)")"
	site cluster_refused "$(redis "$CLUSTER" "$(closed cluster_refused)")"
}
caddyfile "$ADMIN" >"$TMP/Caddyfile"
start_caddy() { # binary Caddyfile log port -> CADDY_STARTED: its PID, once port answers
	HOME=$TMP XDG_DATA_HOME=$TMP XDG_CONFIG_HOME=$TMP "$1" run --config "$2" --adapter caddyfile >"$3" 2>&1 &
	CADDY_STARTED=$!
	PIDS+=($CADDY_STARTED)
	for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$4") 2>/dev/null && break; sleep 0.1; done
	kill -0 "$CADDY_STARTED" 2>/dev/null || { echo "$1 did not start:"; cat "$3"; exit 1; }
}
start_caddy ./caddy "$TMP/Caddyfile" "$TMP/caddy.log" "${PORT[cluster_refused]}"
CADDY_PID=$CADDY_STARTED
OTHER_PID="" OTHER_ADMIN=""
if [ -n "$OTHER_CADDY" ]; then
	free_port
	OTHER_ADMIN=$FREE
	SUFFIX=@other
	caddyfile "$OTHER_ADMIN" >"$TMP/Caddyfile.other"
	SUFFIX=""
	start_caddy "$OTHER_CADDY" "$TMP/Caddyfile.other" "$TMP/caddy-other.log" "${PORT[${OTHER_ROUTES[-1]}@other]}"
	OTHER_PID=$CADDY_STARTED
fi

# caddy-ratelimit's Caddy: the same routes in its syntax (a sliding log of
# 10,000 events per second per key: never reached by 64 keys; 1 per hour:
# refused).
CRL_PID=""
if [ -n "$CRL_CADDY" ]; then
	crl_zone() { printf 'rate_limit {\n\t\tzone api {\n\t\t\tkey {http.request.header.X-API-Key}\n\t\t\tevents %s\n\t\t\twindow %s\n\t\t}\n\t}' "$1" "$2"; }
	free_port
	{
		printf '{\n\tadmin 127.0.0.1:%s\n\tpersist_config off\n\tauto_https off\n\torder rate_limit before respond\n\tlog {\n\t\tlevel ERROR\n\t}\n}\n' "$FREE"
		printf 'http://127.0.0.1:%s {\n\t%s\n\trespond "ok"\n}\n' "${PORT[crl]}" "$(crl_zone 10000 1s)" "${PORT[crl_refused]}" "$(crl_zone 1 1h)"
	} >"$TMP/Caddyfile.crl"
	HOME=$TMP XDG_DATA_HOME=$TMP XDG_CONFIG_HOME=$TMP "$CRL_CADDY" run --config "$TMP/Caddyfile.crl" --adapter caddyfile >"$TMP/caddy-crl.log" 2>&1 &
	CRL_PID=$!
	PIDS+=($CRL_PID)
	for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/${PORT[crl_refused]}") 2>/dev/null && break; sleep 0.1; done
fi

# keys.lua cycles through N API keys (N from the environment), each
# connection waiting DELAY ms after each answer when DELAY is set (RATE).
cat >"$TMP/keys.lua" <<'LUA'
local n, keys = 0, tonumber(os.getenv("KEYS") or "64")
local pause = tonumber(os.getenv("DELAY") or "0")
if pause > 0 then
  delay = function() return pause end
end
request = function()
  n = n + 1
  return wrk.format("GET", "/", { ["X-API-Key"] = "key-" .. (n % keys) })
end
LUA
keys_of() { # route -> number of API keys it is sent
	case ${1%@other} in
	memory_refused | cluster_refused | cluster_1key | crl_refused) echo 1 ;;
	cluster_10k*) echo 10000 ;;
	*) echo 64 ;;
	esac
}

# caddy_cpu <route> is the CPU time so far of the Caddy serving route, in
# seconds (from /proc).
caddy_cpu() {
	local pid=$CADDY_PID
	[[ $1 != crl* ]] || pid=$CRL_PID
	[[ $1 != *@other ]] || pid=$OTHER_PID
	awk -v t="$(getconf CLK_TCK)" '{ printf "%.3f", ($14 + $15) / t }' "/proc/$pid/stat"
}
# redis_sum <addresses> <INFO section> <field regex> <printf format> sums a
# field of INFO over the Redis servers at addresses (space-separated
# host:port).
redis_sum() {
	local a sum=0
	for a in $1; do
		sum=$(redis-cli -h "${a%:*}" -p "${a##*:}" INFO "$2" | tr -d '\r' |
			awk -F: -v s="$sum" -v f="^($3):" -v fmt="$4" '$0 ~ f { s += $2 } END { printf fmt, s }')
	done
	echo "$sum"
}
# redis_cpu <addresses> is the CPU time so far of the Redis servers at
# addresses, in seconds.
redis_cpu() { redis_sum "$1" cpu 'used_cpu_sys|used_cpu_user' '%.3f'; }
# redis_cmds <addresses> is the commands the Redis servers at addresses
# processed so far (INFO stats: a script is one command; replicas count the
# writes they apply).
redis_cmds() { redis_sum "$1" stats total_commands_processed '%d'; }
redis_of() { # route -> the Redis servers it uses (masters and replicas alike)
	case ${1%@other} in
	standalone) echo "$RL_REDIS_STANDALONE" ;;
	cluster*) echo "$CLUSTER" ;;
	esac
}
peer_of() { # route -> the Redis of its peer region
	case ${1%@other} in
	*global*) echo "$RL_REDIS_STANDALONE" ;;
	esac
}

# syncs prints the sync rounds so far by result and the buckets they
# charged: "<ok> <error> <keys>" (Caddy's /metrics).
syncs() { # [route]
	local admin=$ADMIN
	[[ ${1:-} != *@other ]] || admin=$OTHER_ADMIN
	curl -s "http://127.0.0.1:$admin/metrics" | awk '
		/^caddy_rate_limit_syncs_total\{result="ok"\}/ { ok = $2 }
		/^caddy_rate_limit_syncs_total\{result="error"\}/ { err = $2 }
		/^caddy_rate_limit_synced_keys_total / { keys = $2 }
		/^caddy_rate_limit_region_exchanges_total\{region="us",result="ok"\}/ { xok = $2 }
		/^caddy_rate_limit_region_exchanges_total\{region="us",result="error"\}/ { xerr = $2 }
		/^caddy_rate_limit_region_exchanged_keys_total\{region="us"\}/ { xkeys = $2 }
		END { printf "%d %d %d %d %d %d\n", ok, err, keys, xok, xerr, xkeys }'
}

# IDLE holds, by the addresses of a route's Redis servers, the CPU they
# spend a second with no traffic (their cron, a Cluster's bus), measured
# once before the reps (idle_rates): a run's Redis CPU is reported less
# it, so that a route is charged what its requests cost Redis, not what
# the servers spend anyway.
declare -A IDLE
idle_rates() {
	local a c0 t0
	for a in "$RL_REDIS_STANDALONE" "$CLUSTER"; do
		c0=$(redis_cpu "$a") t0=$(date +%s.%N)
		sleep 3
		IDLE[$a]=$(awk -v c0="$c0" -v c1="$(redis_cpu "$a")" -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.6f", (c1 - c0) / (t1 - t0) }')
	done
}
# net_cpu <cpu> <addresses> <seconds>: cpu less what the servers at
# addresses spend idle in that many seconds, at least 0.
net_cpu() {
	local idle=0
	[ -z "$2" ] || idle=${IDLE[$2]:-0}
	awk -v c="$1" -v i="$idle" -v s="$3" 'BEGIN { n = c - i * s; printf "%.3f", (n > 0 ? n : 0) }'
}

run() { # rep route -> prints a line; writes $TMP/<route>.<rep>
	local out="$TMP/$2.$1.txt" c0 r0 k0 s0 prof=""
	if [ "$1" = 1 ] && [ "$2" = "${PROFILE:-}" ]; then
		curl -s -o "bench/${2/@/-}.pprof" "http://127.0.0.1:$ADMIN/debug/pprof/profile?seconds=$((DURATION > 1 ? DURATION - 1 : 1))" &
		prof=$!
	fi
	local peer p0 pk0
	peer=$(peer_of "$2")
	[ -z "$peer" ] || p0=$(redis_cpu "$peer") pk0=$(redis_cmds "$peer")
	c0=$(caddy_cpu "$2") r0=$(redis_cpu "$(redis_of "$2")") k0=$(redis_cmds "$(redis_of "$2")") s0=$(syncs "$2")
	local t0 t1
	t0=$(date +%s.%N)
	DELAY=$DELAY KEYS=$(keys_of "$2") wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency -s "$TMP/keys.lua" "http://127.0.0.1:${PORT[$2]}/" >"$out"
	t1=$(date +%s.%N)
	local rps p99 non2xx reqs ccpu rcpu rcmds secs
	secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
	ccpu=$(awk -v a="$c0" -v b="$(caddy_cpu "$2")" 'BEGIN { printf "%.3f", b - a }')
	rcpu=$(net_cpu "$(awk -v a="$r0" -v b="$(redis_cpu "$(redis_of "$2")")" 'BEGIN { print b - a }')" "$(redis_of "$2")" "$secs")
	rcmds=$(($(redis_cmds "$(redis_of "$2")") - k0))
	rps=$(awk '/Requests\/sec/ {print $2}' "$out")
	reqs=$(awk '/requests in/ {print $1}' "$out")
	p99=$(awk '$1 == "99%" {print $2}' "$out")
	non2xx=$(awk '/Non-2xx/ {print $NF}' "$out")
	local sy=""
	if [[ $2 == *sync* ]]; then # the rounds of the run: ok/error/buckets
		sy=$(echo "$s0 $(syncs "$2")" | awk '{ printf "%d/%d/%d", $7 - $1, $8 - $2, $9 - $3 }')
		echo "$sy" >"$TMP/$2.$1.syncs"
		[[ $sy == */0/* && $sy != 0/* ]] || echo "WARNING: $2: sync rounds ok/error/buckets $sy: the run does not measure working sync" >&2
		awk -v k="${sy##*/}" -v c="$rcpu" -v n="$reqs" \
			'BEGIN { if (k > 0) printf "%.2f %.2f\n", c * 1e6 / k, n / k; else print "- -" }' >"$TMP/$2.$1.perkey"
	fi
	if [ -n "$peer" ]; then # the exchanges of the run with the peer region: ok/error/buckets, and its cost
		sy=$(echo "$s0 $(syncs "$2")" | awk '{ printf "%d/%d/%d", $10 - $4, $11 - $5, $12 - $6 }')
		echo "$sy" >"$TMP/$2.$1.syncs"
		[[ $sy == */0/* && $sy != 0/* ]] || echo "WARNING: $2: exchanges ok/error/buckets $sy: the run does not measure working exchanges" >&2
		awk -v k="$(($(redis_cmds "$peer") - pk0))" -v c="$(net_cpu "$(awk -v a="$p0" -v b="$(redis_cpu "$peer")" 'BEGIN { print b - a }')" "$peer" "$secs")" -v n="$reqs" \
			'BEGIN { printf "%.5f %.2f\n", k / n, c * 1e6 / n }' >"$TMP/$2.$1.peer"
	fi
	printf '%-4s %-22s %12s %10s %10s %14s %14s %16s\n' "$1" "$2" "$rps" "$p99" "${non2xx:-0}" \
		"$(awk -v c="$ccpu" -v n="$reqs" 'BEGIN { printf "%.1f", c * 1e6 / n }')" \
		"$(awk -v c="$rcpu" -v n="$reqs" 'BEGIN { printf "%.1f", c * 1e6 / n }')" "$sy"
	echo "$rps" >"$TMP/$2.$1"
	awk -v c="$ccpu" -v n="$reqs" 'BEGIN { printf "%.2f\n", c * 1e6 / n }' >"$TMP/$2.$1.caddy"
	awk -v c="$rcpu" -v n="$reqs" 'BEGIN { printf "%.2f\n", c * 1e6 / n }' >"$TMP/$2.$1.redis"
	awk -v c="$rcmds" -v n="$reqs" 'BEGIN { printf "%.3f\n", c / n }' >"$TMP/$2.$1.cmds"
	[ -z "$prof" ] || wait "$prof" # the profile
}

echo "wrk -t2 -c$CONNS -d${DURATION}s${RATE:+, about $RATE req/s offered (each connection waits $DELAY ms after an answer)}, $REPS interleaved reps; caddy $(./caddy version | cut -d' ' -f1); $(nproc) cores"
printf '%-4s %-22s %12s %10s %10s %14s %14s %16s\n' rep route req/s p99 non-2xx caddy-µs/req redis-µs/req syncs-ok/err/keys
idle_rates
echo "Redis CPU idle, a second (less from each run's): standalone ${IDLE[$RL_REDIS_STANDALONE]} s, cluster ${IDLE[$CLUSTER]} s"
for rep in $(seq "$REPS"); do
	for r in "${MEASURED[@]}"; do run "$rep" "$r"; done
done

echo
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "medians of the $REPS reps: the ratio to plain (per rep, against that rep's plain run), CPU per request"
echo "of Caddy, its extra over plain (per rep, against that rep's plain run) and of Redis, in µs;"
echo "Redis commands per request (all the route's servers; a script is one); the sync rounds of"
echo "all reps, ok/error/buckets charged"
printf '%-22s %-22s %6s %10s %10s %10s %10s %18s\n' route "ratio per rep" ratio caddy extra redis cmds syncs
for r in "${MEASURED[@]}"; do
	ratios=() extras=()
	for rep in $(seq "$REPS"); do
		ratios+=("$(awk -v a="$(cat "$TMP/$r.$rep")" -v p="$(cat "$TMP/plain.$rep")" 'BEGIN { printf "%.2f", a / p }')")
		extras+=("$(awk -v a="$(cat "$TMP/$r.$rep.caddy")" -v p="$(cat "$TMP/plain.$rep.caddy")" 'BEGIN { printf "%.2f", a - p }')")
	done
	sy=""
	[[ $r != *sync* && -z "$(peer_of "$r")" ]] || sy=$(cat "$TMP/$r".*.syncs | awk -F/ '{ o += $1; e += $2; k += $3 } END { printf "%d/%d/%d", o, e, k }')
	printf '%-22s %-22s %6s %10s %10s %10s %10s %18s\n' "$r" "${ratios[*]}" "$(printf '%s\n' "${ratios[@]}" | median)" \
		"$(cat "$TMP/$r".*.caddy | median)" "$(printf '%s\n' "${extras[@]}" | median)" "$(cat "$TMP/$r".*.redis | median)" \
		"$(cat "$TMP/$r".*.cmds | median)" "$sy"
done
for r in "${MEASURED[@]}"; do # what a synced zone costs Redis: per bucket a round charges
	[[ $r == *sync* ]] || continue
	printf '%s: per bucket charged in a round, %s µs of Redis CPU, carrying %s requests (medians)\n' "$r" \
		"$(cut -d' ' -f1 "$TMP/$r".*.perkey | median)" "$(cut -d' ' -f2 "$TMP/$r".*.perkey | median)"
done
for r in "${MEASURED[@]}"; do
	[ -n "$(peer_of "$r")" ] || continue
	printf '%s: the exchange with the peer region, per request: %s Redis commands, %s µs of its CPU (medians)\n' "$r" \
		"$(cat "$TMP/$r".*.peer | cut -d' ' -f1 | median)" "$(cat "$TMP/$r".*.peer | cut -d' ' -f2 | median)"
done

# Constant rate: half, a quarter, then an eighth of plain's peak as vegeta
# itself measures it (vegeta costs more CPU per request than wrk, and
# shares the cores), for plain and the cluster route, twice each,
# interleaved. At half, the cluster route needs most of 2 cores (Caddy,
# vegeta and 7 Redis processes), so its p99 shows the machine's queueing;
# the lower the rate, the more it shows what the route itself adds.
targets() { # route -> a targets file of 64 keys
	for i in $(seq 0 63); do printf 'GET http://127.0.0.1:%s/\nX-API-Key: key-%s\n\n' "${PORT[$1]}" "$i"; done >"$TMP/targets.$1"
	echo "$TMP/targets.$1"
}
peak=$("$VEGETA" attack -rate=0 -max-workers="$CONNS" -duration="${DURATION}s" -targets="$(targets plain)" |
	"$VEGETA" report -type=json | sed -E 's/.*"throughput":([0-9.]+).*/\1/')
echo
echo "vegeta: plain's peak ${peak%.*} req/s, 64 keys; constant rates for ${DURATION}s"
for share in 2 4 8; do # half, a quarter, an eighth of plain's peak
	rate=$(awk -v p="$peak" -v s="$share" 'BEGIN { printf "%d", p / s }')
	echo "1/$share of the peak: ${rate} req/s"
	for r in plain cluster_10k plain cluster_10k; do
		"$VEGETA" attack -rate="$rate" -duration="${DURATION}s" -targets="$(targets "$r")" -max-workers=256 |
			"$VEGETA" report -type=text >"$TMP/vegeta.$r.txt"
		printf '%-16s %s\n' "$r" "$(grep -E '^Latencies' "$TMP/vegeta.$r.txt" | sed 's/  */ /g')"
		printf '%-16s %s\n' "" "$(grep -E '^Success|^Status' "$TMP/vegeta.$r.txt" | tr '\n' ' ' | sed 's/  */ /g')"
	done
done
