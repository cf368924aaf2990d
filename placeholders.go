package ratelimit

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// A placeholder that Caddy's HTTP server cannot fill resolves to nothing,
// so a typo in a zone's key ({clientip}, {http.request.heder.X-Key})
// silently gives every client one bucket. checkPlaceholders refuses the
// placeholders of a zone's templates that cannot be meant: an unknown name
// of Caddy's http.request family, a name one or two edits from a known one,
// and, in JSON, the Caddyfile's shorthands ({client_ip}), which only the
// Caddyfile adapter expands. Names of other modules (http.vars.*,
// http.auth.*, a map's outputs, ...) pass.

// requestPlaceholders are the http.request placeholders of Caddy's HTTP
// server, and requestFamilies those that take a name after them.
var (
	requestPlaceholders = []string{"http.request.body", "http.request.duration", "http.request.duration_ms",
		"http.request.host", "http.request.hostport", "http.request.local", "http.request.local.host",
		"http.request.local.port", "http.request.method", "http.request.orig_method", "http.request.orig_uri",
		"http.request.orig_uri.path", "http.request.orig_uri.path.dir", "http.request.orig_uri.path.file",
		"http.request.orig_uri.prefixed_query", "http.request.orig_uri.query", "http.request.port",
		"http.request.proto", "http.request.proto_name", "http.request.remote", "http.request.remote.host",
		"http.request.remote.port", "http.request.scheme", "http.request.uri", "http.request.uri.path",
		"http.request.uri.path.dir", "http.request.uri.path.file", "http.request.uri.path.file.base",
		"http.request.uri.path.file.ext", "http.request.uri.path_escaped", "http.request.uri.prefixed_query",
		"http.request.uri.query", "http.request.uri.query_escaped", "http.request.uri_escaped", "http.request.uuid"}
	requestFamilies = []string{"http.request.header.", "http.request.cookie.", "http.request.host.labels.",
		"http.request.orig_uri.path.", "http.request.tls.", "http.request.uri.path.", "http.request.uri.query."}
	// otherFamilies are the placeholders other modules set.
	otherFamilies = []string{"http.vars.", "http.auth.", "http.reverse_proxy.", "http.rate_limit.", "http.regexp.",
		"http.matchers.", "http.error.", "http.intercept.", "http.response.", "http.jwt.", "env.", "system.", "time.",
		"file."}
	// shorthands are the Caddyfile's, by what they stand for.
	shorthands = map[string]string{"client_ip": "http.vars.client_ip", "remote_host": "http.request.remote.host",
		"remote": "http.request.remote", "remote_port": "http.request.remote.port", "host": "http.request.host",
		"hostport": "http.request.hostport", "method": "http.request.method", "uri": "http.request.uri",
		"path": "http.request.uri.path", "query": "http.request.uri.query", "scheme": "http.request.scheme"}
	// shorthandFamilies are the Caddyfile's shorthands that take a name
	// after them ({header.X-Key}), by what they stand for; {file.*} is a
	// placeholder of its own in JSON.
	shorthandFamilies = map[string]string{"header.": "http.request.header.", "cookie.": "http.request.cookie.",
		"labels.": "http.request.host.labels.", "path.": "http.request.uri.path.", "query.": "http.request.uri.query.",
		"vars.": "http.vars.", "re.": "http.regexp.", "rp.": "http.reverse_proxy.", "resp.": "http.intercept.",
		"err.": "http.error.", "file_match.": "http.matchers.file."}
)

// placeholderName finds the names of a template's placeholders.
var placeholderName = regexp.MustCompile(`\{([^{}\s]+)\}`)

// checkPlaceholders checks the braces and placeholders of tmpl, a zone's
// field; in JSON (not adapted from a Caddyfile), a shorthand is an error
// too.
func checkPlaceholders(field, tmpl string) error {
	if err := checkBraces(field, tmpl); err != nil {
		return err
	}
	for _, m := range placeholderName.FindAllStringSubmatch(tmpl, -1) {
		if err := checkPlaceholder(m[1]); err != nil {
			return fmt.Errorf("%s %q: %w", field, tmpl, err)
		}
	}
	return nil
}

// constantFamilies are the placeholders whose value is the same for every
// request: the environment, the system, the time, a file's contents.
var constantFamilies = []string{"env.", "system.", "time.", "file."}

// checkConstantKey refuses a key whose placeholders are all of
// constantFamilies: every client would share one bucket, which a zone
// says with key static, or no key. (Without Redis only: with a Redis that
// instances share, {system.hostname} is a bucket per instance.)
func checkConstantKey(key string) error {
	names := placeholderName.FindAllStringSubmatch(key, -1)
	for _, m := range names {
		if !hasFamily(m[1], constantFamilies) {
			return nil
		}
	}
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("key %q is the same for every request: its placeholders do not depend on the request, so every client "+
		"would share one bucket; for one bucket for the whole zone write key static (or no key), for a bucket per client "+
		"add a request placeholder such as {client_ip}", key)
}

// checkPlaceholder checks one placeholder name.
func checkPlaceholder(name string) error {
	if full, ok := shorthands[name]; ok {
		return fmt.Errorf("{%s} is a shorthand of the Caddyfile only: in JSON write {%s}", name, full)
	}
	for short, full := range shorthandFamilies {
		if rest, ok := strings.CutPrefix(name, short); ok && rest != "" {
			return fmt.Errorf("{%s} is a shorthand of the Caddyfile only: in JSON write {%s%s}", name, full, rest)
		}
	}
	if slices.Contains(requestPlaceholders, name) || hasFamily(name, requestFamilies) || hasFamily(name, otherFamilies) {
		return nil
	}
	guess := closestPlaceholder(name)
	switch {
	case strings.HasPrefix(name, "http.request."):
		return fmt.Errorf("{%s} is not a placeholder of Caddy's HTTP server (it would be empty for every request)%s", name, guess)
	case guess != "":
		return fmt.Errorf("{%s} is no placeholder Caddy knows (it would be empty for every request)%s", name, guess)
	}
	return nil // a map's output, a variable, another module's
}

// hasFamily reports whether name is a placeholder of one of families,
// with a name after it.
func hasFamily(name string, families []string) bool {
	for _, f := range families {
		if len(name) > len(f) && strings.HasPrefix(name, f) {
			return true
		}
	}
	return false
}

// closestPlaceholder is ": did you mean {…}?" for the known placeholder
// closest to name, or "": for a name of the http namespace, a placeholder
// or family of Caddy's HTTP server at most 2 edits away; for a name
// without a dot, of 6 characters or more, a Caddyfile shorthand 1 edit
// away ({clientip}). Shorter names and other namespaces are left alone:
// a map's output ({cost}) or another module's placeholder may be near a
// known name.
func closestPlaceholder(name string) string {
	best, bestDist := "", 3
	try := func(candidate, compared, known string) {
		if d := editDistance(compared, known); d < bestDist && d > 0 {
			best, bestDist = candidate, d
		}
	}
	switch {
	case strings.HasPrefix(name, "http."):
		for _, p := range requestPlaceholders {
			try(p, name, p)
		}
		for _, f := range slices.Concat(requestFamilies, otherFamilies) {
			n := strings.Count(f, ".")
			if parts := strings.SplitN(name, ".", n+1); len(parts) == n+1 && parts[n] != "" {
				try(f+parts[n], strings.Join(parts[:n], ".")+".", f)
			}
		}
	case !strings.Contains(name, ".") && len(name) >= 6:
		bestDist = 2
		for short := range shorthands { // as the Caddyfile writes it
			try(short, name, short)
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(": did you mean {%s}?", best)
}

// forgeable are the request headers a client sets at will that name a
// client address: a key on them raw is the client's choice.
var forgeable = regexp.MustCompile(`(?i)\{http\.request\.header\.(x-forwarded-for|x-real-ip|forwarded|true-client-ip|cf-connecting-ip)\}`)

// warnForgeableKey warns when a zone's key is a header that names a
// client address, which any client can set: {client_ip} with the
// server's trusted_proxies is the address a trusted proxy reports.
func warnForgeableKey(logger *zap.Logger, zone, key string) {
	if forgeable.MatchString(key) {
		logger.Warn("a zone's key is a header that any client can set; key on {client_ip}, and list your proxies in the servers' trusted_proxies option, so that it is the address they report",
			zap.String("zone", zone), zap.String("key", key))
	}
}

// warnLeftmostClientIP warns when a zone's key holds {client_ip} and the
// server the handler is provisioned in trusts proxies without
// trusted_proxies_strict: {client_ip} is then the leftmost address of
// X-Forwarded-For, which a client behind a proxy that appends to the
// header writes itself, for a fresh bucket per request.
func warnLeftmostClientIP(ctx caddy.Context, logger *zap.Logger, zone, key string) {
	if !keysByClientIP(key) {
		return
	}
	srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok || srv == nil || srv.TrustedProxiesStrict > 0 || !trustsProxies(srv) {
		return
	}
	logger.Warn("the zone's key is {client_ip}, and the server trusts proxies without trusted_proxies_strict: "+
		"{client_ip} is then the leftmost address of X-Forwarded-For (or of the client_ip_headers), which a client "+
		"behind a proxy that appends to the header writes itself (X-Forwarded-For: <any address>), for a fresh "+
		"bucket per request; add trusted_proxies_strict to the server's options (servers { trusted_proxies_strict }), "+
		"so that {client_ip} is the rightmost address that is not a trusted proxy's",
		zap.String("zone", zone), zap.String("key", key), zap.String("server", srv.Name()),
		zap.Strings("client_ip_headers", srv.ClientIPHeaders))
}

// keysByClientIP reports whether key holds {client_ip}.
func keysByClientIP(key string) bool {
	for _, m := range placeholderName.FindAllStringSubmatch(key, -1) {
		if m[1] == "http.vars.client_ip" || m[1] == "client_ip" {
			return true
		}
	}
	return false
}

// trustsProxies reports whether srv trusts proxies: trusted_proxies_unix,
// or trusted_proxies, which Caddy loads before it provisions the server's
// handlers, into an unexported field (dropping the raw JSON).
func trustsProxies(srv *caddyhttp.Server) bool {
	if srv.TrustedProxiesUnix || srv.TrustedProxiesRaw != nil {
		return true
	}
	f := reflect.ValueOf(srv).Elem().FieldByName("trustedProxies")
	return f.IsValid() && f.Kind() == reflect.Interface && !f.IsNil()
}
