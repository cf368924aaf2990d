#!/usr/bin/env bash
# The fleet's curves: bench/fleetsim over instances, keys and regions, in
# one run, one line per point (the table of BENCHMARKS.md, "A fleet in one
# process: curves"). It needs the Redis of internal/redistest/redisfleet
# ($RL_REDIS_CLUSTER, $RL_REDIS_STANDALONE) and, for the regions, standalone
# servers of their own: it starts three on free loopback ports and stops
# them by PID when it ends.
#
#   bench/curves.sh [seconds per point, default 8] [fleetsim flags...]
#
# Every point runs -keys 100000 -zipf 1 -rate 10r/s -burst 20 -qps 10000
# unless its line says otherwise (-qps 0: as fast as the fleet decides);
# extra flags go to every point.
set -euo pipefail
secs=${1:-8}
shift $(($# < 1 ? $# : 1))
: "${RL_REDIS_CLUSTER:?source the env file of internal/redistest/redisfleet}"
: "${RL_REDIS_STANDALONE:?source the env file of internal/redistest/redisfleet}"
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$dir"
}
trap cleanup EXIT
go build -o "$dir/fleetsim" ./bench/fleetsim
extra=()
for i in 1 2 3; do
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >/dev/null 2>&1 &
	pids+=($!)
	extra+=("127.0.0.1:$port")
done
for a in "${extra[@]}"; do
	until redis-cli -h 127.0.0.1 -p "${a#*:}" ping >/dev/null 2>&1; do sleep 0.1; done
done
regions="eu=cluster:$RL_REDIS_CLUSTER;us=$RL_REDIS_STANDALONE;ap=${extra[0]};sa=${extra[1]};af=${extra[2]}"
point() {
	"$dir/fleetsim" -keys 100000 -zipf 1 -rate 10r/s -burst 20 -qps 10000 -duration "${secs}s" "$@" "${args[@]}" 2>/dev/null ||
		echo "fleetsim $* failed"
}
args=("$@")
for n in 1 3 10 30 100; do point -mode exact -instances "$n" -redis "cluster:$RL_REDIS_CLUSTER"; done
for q in 2500 5000 20000 0; do point -mode exact -instances 10 -qps "$q" -redis "cluster:$RL_REDIS_CLUSTER"; done
for n in 1 3 10 30 100; do point -mode sync -instances "$n" -redis "cluster:$RL_REDIS_CLUSTER"; done
for k in 1000 1000000; do point -mode sync -instances 10 -keys "$k" -redis "cluster:$RL_REDIS_CLUSTER"; done
for r in 2 3 5; do point -mode regions -instances $((2 * r)) -regions "$r" -redis "$regions"; done
point -mode regions -instances 30 -regions 3 -redis "$regions"
point -mode regions -instances 6 -regions 3 -keys 1000000 -redis "$regions"
