package clientkey

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// discoveryPath follows the issuer in the URL of its OpenID Connect
// discovery document.
const discoveryPath = "/.well-known/openid-configuration"

// maxRedirects is how many redirects a fetch follows.
const maxRedirects = 5

// CheckKeyURL parses a URL that keys are fetched from: HTTPS, or HTTP to a
// loopback host (localhost, 127.0.0.0/8, ::1), so that nobody on the
// network can swap the keys.
func CheckKeyURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	switch {
	case u.Host == "":
		return nil, fmt.Errorf("%q: want an absolute https:// URL", raw)
	case u.Scheme == "https":
		return u, nil
	case u.Scheme == "http" && loopback(u.Hostname()):
		return u, nil
	}
	return nil, fmt.Errorf("%q: want https:// (http:// only to a loopback host)", raw)
}

func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkRedirect follows a few redirects, each to a URL that CheckKeyURL
// accepts.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return fmt.Errorf("more than %d redirects", maxRedirects)
	}
	_, err := CheckKeyURL(req.URL.String())
	return err
}

// get reads the body of a 200 answer to GET u, at most MaxSize bytes.
func (r *RemoteKeySet) get(ctx context.Context, u, accept string) ([]byte, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Accept", accept)
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("GET %s: status %d", u, resp.StatusCode)
	}
	tooLong := fmt.Errorf("%w: GET %s: over %d bytes", ErrKeySetRejected, u, r.opts.MaxSize)
	if resp.ContentLength > r.opts.MaxSize {
		return nil, nil, tooLong
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, r.opts.MaxSize+1))
	if err != nil {
		return nil, nil, fmt.Errorf("GET %s: %w", u, err)
	}
	if int64(len(body)) > r.opts.MaxSize {
		return nil, nil, tooLong
	}
	return body, resp.Header, nil
}

// discover reads the JWKS URL from the issuer's discovery document, whose
// issuer must be the one configured.
func (r *RemoteKeySet) discover(ctx context.Context) (string, error) {
	u := strings.TrimSuffix(r.opts.URL, "/") + discoveryPath
	body, _, err := r.get(ctx, u, "application/json")
	if err != nil {
		return "", fmt.Errorf("discovery: %w", err)
	}
	var doc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return "", fmt.Errorf("%w: discovery document %s: %v", ErrKeySetRejected, u, err)
	}
	if doc.Issuer != r.opts.URL {
		return "", fmt.Errorf("%w: discovery document %s: issuer %q, want %q", ErrKeySetRejected, u, doc.Issuer, r.opts.URL)
	}
	if _, err := CheckKeyURL(doc.JWKSURI); err != nil {
		return "", fmt.Errorf("%w: discovery document %s: jwks_uri: %v", ErrKeySetRejected, u, err)
	}
	return doc.JWKSURI, nil
}

// refreshAfter is when to fetch again after a response with header h:
// its Cache-Control max-age (less its Age), within [lo, hi]; lo for
// no-cache or no-store; hi when it says nothing.
func refreshAfter(h http.Header, lo, hi time.Duration) time.Duration {
	maxAge, found := int64(-1), false
	for _, v := range h.Values("Cache-Control") {
		for _, d := range strings.Split(v, ",") {
			name, value, _ := strings.Cut(strings.TrimSpace(d), "=")
			switch strings.ToLower(name) {
			case "no-cache", "no-store":
				return lo
			case "max-age":
				n, err := strconv.ParseInt(strings.Trim(value, `"`), 10, 64)
				if err == nil && n >= 0 {
					maxAge, found = n, true
				}
			}
		}
	}
	if !found {
		return hi
	}
	if age, err := strconv.ParseInt(h.Get("Age"), 10, 64); err == nil && age > 0 {
		maxAge = max(maxAge-age, 0)
	}
	if maxAge > int64(hi/time.Second) {
		return hi
	}
	return max(time.Duration(maxAge)*time.Second, lo)
}

// errNoKeys is Verify's error while a remote set has no keys to use.
var errNoKeys = errors.New("no keys: the key set is not fetched yet, or too old to use")
