#!/usr/bin/env bash
# Builds, runs and tests Caddy with the rate_limit module.
#
#   ./xcaddy.sh build          build ./caddy: Caddy v2.11.9 with this module
#   ./xcaddy.sh run [args...]  build, then run ./caddy on Caddyfile.example;
#                              the args go to `caddy run`
#   ./xcaddy.sh test [args...] the whole test suite (gofmt, go vet, go test
#                              -race with real Caddy and real Redis); the args
#                              go to `go test`
set -euo pipefail
cd "$(dirname "$0")"

CADDY_VERSION=${CADDY_VERSION:-v2.11.9}
XCADDY_VERSION=v0.4.5
MODULE=$(go list -m)

# xcaddy_path prints the path of xcaddy, installing it with `go install` if missing.
xcaddy_path() {
	if type -P xcaddy >/dev/null 2>&1; then
		type -P xcaddy
		return
	fi
	local bin
	bin="$(go env GOPATH)/bin/xcaddy"
	if [ ! -x "$bin" ]; then
		echo "installing xcaddy $XCADDY_VERSION" >&2
		go install "github.com/caddyserver/xcaddy/cmd/xcaddy@$XCADDY_VERSION"
	fi
	echo "$bin"
}

# build_caddy <output> builds Caddy with this module into <output>.
build_caddy() {
	"$(xcaddy_path)" build "$CADDY_VERSION" --with "$MODULE@v0.0.0=$PWD" --output "$1"
}

cmd_build() {
	build_caddy ./caddy
}

cmd_run() {
	cmd_build
	exec ./caddy run --config Caddyfile.example --adapter caddyfile "$@"
}

# ensure_redis installs redis-server (Debian's package, with redis-cli)
# when it is missing.
ensure_redis() {
	if type -P redis-server >/dev/null && type -P redis-cli >/dev/null; then
		return
	fi
	echo "installing redis-server" >&2
	local sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
	# The package starts a system service on port 6379; the tests use their own.
}

TEST_TMP=""
FLEET_PID=""

# cleanup stops the Redis fleet (by its PID; it stops its redis-servers)
# and removes the temporary files.
cleanup() {
	if [ -n "$FLEET_PID" ]; then
		kill "$FLEET_PID" 2>/dev/null || true
		wait "$FLEET_PID" 2>/dev/null || true
	fi
	[ -z "$TEST_TMP" ] || rm -rf "$TEST_TMP"
}

# start_redis_fleet starts a Redis Cluster (3 masters, 3 replicas) and a
# standalone Redis on loopback and exports their addresses.
start_redis_fleet() {
	go build -o "$TEST_TMP/redisfleet" ./internal/redistest/redisfleet
	mkdir -p "$TEST_TMP/redis"
	"$TEST_TMP/redisfleet" -env "$TEST_TMP/redis.env" -dir "$TEST_TMP/redis" &
	FLEET_PID=$!
	for _ in $(seq 300); do
		[ -f "$TEST_TMP/redis.env" ] && break
		kill -0 "$FLEET_PID" 2>/dev/null || { echo "redis fleet failed to start" >&2; return 1; }
		sleep 0.1
	done
	# shellcheck disable=SC1091
	source "$TEST_TMP/redis.env"
	export RL_REQUIRE_REDIS=1
}

cmd_test() {
	local unformatted
	unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
	if [ -n "$unformatted" ]; then
		echo "gofmt would change: $unformatted" >&2
		return 1
	fi
	# -race here and below: vet, the tests and the Caddy build then compile
	# every dependency once, with the same flags, and share the build cache.
	go vet -race ./...
	ensure_redis
	TEST_TMP=$(mktemp -d)
	trap cleanup EXIT
	trap 'exit 130' INT TERM
	start_redis_fleet
	# The end-to-end tests run this binary, built as users build it, with
	# the race detector on. xcaddy's default flags add -trimpath, which would
	# compile all of Caddy a second time; these keep its tags and drop it.
	XCADDY_RACE_DETECTOR=1 XCADDY_GO_BUILD_FLAGS="-tags=nobadger,nomysql,nopgx" \
		build_caddy "$TEST_TMP/caddy"
	CADDY_BIN="$TEST_TMP/caddy" go test -race -count=1 -timeout 15m ./... "$@"
}

case "${1:-}" in
build | run | test)
	cmd=$1
	shift
	"cmd_$cmd" "$@"
	;;
*)
	echo "usage: $0 build | run [caddy run args] | test [go test args]" >&2
	exit 2
	;;
esac
