package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestJWTConfigErrors(t *testing.T) {
	t.Setenv("RL_TEST_SHORT", "short")
	cases := map[string]struct {
		cfg  JWTConfig
		want string
	}{
		"no key":              {JWTConfig{}, "no key"},
		"unknown placeholder": {JWTConfig{Secret: "{ENV.JWT_SECRET}"}, "secret: unrecognized placeholder"},
		"unset env":           {JWTConfig{Secret: "{env.RL_TEST_UNSET}"}, "evaluated placeholder {env.RL_TEST_UNSET} is empty"},
		"short secret":        {JWTConfig{Secret: "{env.RL_TEST_SHORT}"}, "secret of 5 bytes: want at least 32"},
		"header and cookie":   {JWTConfig{Secret: strings.Repeat("s", 32), FromHeader: "X", FromCookie: "c"}, "not both"},
		"missing pem":         {JWTConfig{PublicKeyFile: "/nonexistent.pem"}, "no such file"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if _, _, err := c.cfg.verifier(nil); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("verifier() = %v; want %q", err, c.want)
			}
		})
	}
}

func TestJWTTokenSources(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer  abc.def.ghi ")
	r.Header.Set("X-Token", "bearer tok.en.x")
	r.AddCookie(&http.Cookie{Name: "session", Value: "coo.kie.y"})
	cases := []struct {
		cfg  JWTConfig
		want string
	}{
		{JWTConfig{}, "abc.def.ghi"},
		{JWTConfig{FromHeader: "X-Token"}, "tok.en.x"},
		{JWTConfig{FromHeader: "X-Missing"}, ""},
		{JWTConfig{FromCookie: "session"}, "coo.kie.y"},
		{JWTConfig{FromCookie: "missing"}, ""},
	}
	for _, c := range cases {
		if got := c.cfg.token(r); got != c.want {
			t.Errorf("%+v: token %q; want %q", c.cfg, got, c.want)
		}
	}
	basic := httptest.NewRequest(http.MethodGet, "/", nil)
	basic.SetBasicAuth("u", "p")
	if got := (&JWTConfig{}).token(basic); !strings.HasPrefix(got, "Basic ") {
		t.Errorf("Basic credentials: token %q; want them left as they are (and refused by the verifier)", got)
	}
}
