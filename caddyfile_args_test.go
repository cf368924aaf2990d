package ratelimit

import (
	"strings"
	"testing"
)

// TestRateMessages: a rate written wrong fails adapt with its line and
// says how to write it.
func TestRateMessages(t *testing.T) {
	cases := map[string]string{
		"rate 10 r/s":                       "write a rate without spaces: 10r/s",
		"rate 10r/ms":                       "10r/ms is 10000r/s",
		"rate 0.5r/s":                       "write 1r/2s or 30r/m",
		"rate 10/s":                         "10r/s, 1r/2s or 30r/m",
		"rate 1r/s 2r/s":                    "a second one is only the default of a placeholder",
		"rate 100r/min":                     `unknown unit "min": write 100r/m`,
		"rate 1r/sec":                       `unknown unit "sec": write 1r/s`,
		"rate 5r/hours":                     `unknown unit "hours": write 5r/h`,
		"rate 2r/10min":                     `unknown unit "min": write 2r/10m`,
		"rate 1r/day":                       `unknown unit "day": write 1r/d`,
		"rate 1r/week":                      `unknown unit "week" (want s, m, h or d)`,
		"rate {http.vars.plan} 100r/minute": `unknown unit "minute": write 100r/m`,
	}
	for line, want := range cases {
		_, err := adapt(t, ":8080 {\n\trate_limit {\n\t\tzone z {\n\t\t\tkey k\n\t\t\t"+line+"\n\t\t}\n\t}\n}\n")
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "Caddyfile:5") {
			t.Errorf("%s: %v; want %q, at Caddyfile:5", line, err, want)
		}
	}
	for _, z := range []*Zone{{Key: "k", Rate: "100r/min"}, {Key: "k", Rate: "{http.vars.plan}", DefaultRate: "100r/min"}} {
		err := provision(t, &Handler{Zones: map[string]*Zone{"z": z}})
		if err == nil || !strings.Contains(err.Error(), `unknown unit "min": write 100r/m`) {
			t.Errorf("JSON rate %q, default %q: %v; want the unit meant", z.Rate, z.DefaultRate, err)
		}
	}
}

// TestDidYouMean: a misspelt subdirective gets the closest valid one.
func TestDidYouMean(t *testing.T) {
	cases := map[string]string{
		"zone z {\n\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tbrust 5\n\t\t}": `unrecognized subdirective "brust": did you mean burst?`,
		"zone z {\n\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tcots 5\n\t\t}":  `unrecognized subdirective "cots": did you mean cost?`,
		"on_store_eror allow": `unrecognized subdirective "on_store_eror": did you mean on_store_error?`,
		"zone z {\n\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tfoo 5\n\t\t}": `unrecognized subdirective "foo", at`,
	}
	for body, want := range cases {
		_, err := adapt(t, ":8080 {\n\trate_limit {\n\t\t"+body+"\n\t}\n}\n")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want %q", body, err, want)
		}
	}
}
