package ratelimit

import (
	"fmt"
	"maps"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// deepHeader is hdr with every value's bytes copied: what it said, even if
// the bytes its strings point at were written again.
func deepHeader(hdr http.Header) http.Header {
	c := make(http.Header, len(hdr))
	for k, vs := range hdr {
		for _, v := range vs {
			c[k] = append(c[k], strings.Clone(v))
		}
	}
	return c
}

// TestHeaderValuesOutliveTheirRequest: the values of a response's limit
// fields, and a refusal's, whose digits share one block with the values'
// array (headerFields.text), say what they said when written after later
// requests and collections, in every headers option, allowed and refused,
// with handle_errors, from requests served at once: no block's bytes are
// written again, nor shared by two responses (a proxy or a logger may keep
// a response's header).
func TestHeaderValuesOutliveTheirRequest(t *testing.T) {
	for _, headers := range []string{"", "ietf", "both", "none"} {
		for _, response := range []string{"json", "handle_errors"} {
			t.Run(headers+"/"+response, func(t *testing.T) {
				h := &Handler{Headers: headers, Response: response, Zones: map[string]*Zone{
					"outlive": {Key: "{http.request.header.X-Key}", Rate: "3r/m"}}}
				clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
				h.now = clock.Now
				if err := provision(t, h); err != nil {
					t.Fatal(err)
				}
				var mu sync.Mutex
				var kept, want []http.Header
				var wg sync.WaitGroup
				for g := range 4 {
					wg.Go(func() {
						for i := range 150 {
							w := serve(h, keyRequest(fmt.Sprintf("k%d-%d", g, i%7)))
							mu.Lock()
							kept, want = append(kept, w.Header()), append(want, deepHeader(w.Header()))
							mu.Unlock()
							if i%50 == 0 {
								clock.Advance(7 * time.Second)
								runtime.GC()
							}
						}
					})
				}
				wg.Wait()
				runtime.GC()
				for i := range kept {
					if !maps.EqualFunc(kept[i], want[i], func(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }) {
						t.Fatalf("response %d: header now %v; was %v", i, kept[i], want[i])
					}
				}
			})
		}
	}
}
