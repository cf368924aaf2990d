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

cmd_test() {
	local unformatted
	unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
	if [ -n "$unformatted" ]; then
		echo "gofmt would change: $unformatted" >&2
		return 1
	fi
	go vet ./...
	local tmp
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	# The end-to-end tests run this binary, built as users build it, with
	# the race detector on.
	XCADDY_RACE_DETECTOR=1 build_caddy "$tmp/caddy"
	CADDY_BIN="$tmp/caddy" go test -race -count=1 -timeout 15m ./... "$@"
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
