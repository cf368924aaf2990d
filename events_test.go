package ratelimit

import (
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func TestExceededEvent(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"login": {Key: "{http.request.remote.host}", MaxEvents: 1, Window: caddy.Duration(time.Minute)}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	rec := new(eventRecorder)
	withEvents(t, h, rec)
	expectStatus(t, h, clientRequest("GET", "/", "10.0.0.1"), 200, "")
	expectStatus(t, h, clientRequest("GET", "/", "10.0.0.1"), 429, "60")
	if len(rec.events) != 1 {
		t.Fatalf("%d events; want 1, for the refusal only", len(rec.events))
	}
	ev := rec.events[0]
	wait, _ := ev.Data["wait"].(time.Duration)
	if ev.Name() != "rate_limit_exceeded" || ev.Data["zone"] != "login" || ev.Data["remote_ip"] != "10.0.0.1" ||
		ev.Data["client_ip"] != "10.0.0.1" || ev.Data["retry_after"] != int64(60) || wait <= 59*time.Second || wait > time.Minute {
		t.Fatalf("event %s %v", ev.Name(), ev.Data)
	}
}
