#!/usr/bin/env bash
# How long Redis calls take on a loaded host: the figure behind Redis's
# default `timeout`. Runs bench/fleetsim in mode exact (every decision a
# Redis call) at a fixed rate against the Redis of -redis (or
# $RL_REDIS_CLUSTER as a Cluster), once with the host as it is and once
# with <hogs> busy loops beside it (`yes > /dev/null`, each a core's
# worth of demand), with a timeout far above the tail so that no call
# fails, and prints each run's load average and fleetsim's lat_us
# (p50/p99/p99.9/max, µs) and lat_over_ppm: how many decisions in a
# million took longer than 10, 25, 50, 100 and 250 ms, that is, how many a
# timeout of that length would have failed (on_store_error deciding them
# instead), each adding at most that long to its request.
#
#   bench/timeout.sh [seconds, default 30] [hogs, default 4] [fleetsim flags...]
#
# The busy loops are stopped by PID when the script ends.
set -euo pipefail
secs=${1:-30}
hogs=${2:-4}
shift $(($# < 2 ? $# : 2))
cd "$(dirname "$0")/.."
bin=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$bin"
}
trap cleanup EXIT
go build -o "$bin/fleetsim" ./bench/fleetsim
redis=()
if [[ " $* " != *" -redis "* ]]; then
	: "${RL_REDIS_CLUSTER:?set RL_REDIS_CLUSTER or pass -redis (see the doc of bench/fleetsim)}"
	redis=(-redis "cluster:$RL_REDIS_CLUSTER")
fi
run() {
	local line load
	line=$("$bin/fleetsim" -mode exact -instances 2 -keys 10000 -rate 10r/s -qps 2000 -timeout 5s \
		-duration "${secs}s" "${redis[@]}" "$@" 2>/dev/null)
	load=$(cut -d' ' -f1-3 /proc/loadavg)
	printf 'load average %s: ' "$load"
	printf '%s\n' $line | grep -E '^(decisions/s|lat_us|lat_over_ppm|fallback|errors)=' | paste -sd' '
}
echo "as it is:"
run "$@"
for _ in $(seq "$hogs"); do
	yes >/dev/null &
	pids+=($!)
done
sleep 10 # the load average climbs
echo "with $hogs busy loops:"
run "$@"
