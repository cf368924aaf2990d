// Command caddybin is Caddy with its standard modules and this module, as
// xcaddy builds it. The end-to-end tests build it when CADDY_BIN is unset.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-ratelimit/caddy-rate-limit"
)

func main() {
	caddycmd.Main()
}
