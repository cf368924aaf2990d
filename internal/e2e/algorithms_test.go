package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
)

// stores are the store configurations the algorithm tests run on.
func stores(t *testing.T) map[string]string {
	return map[string]string{
		"memory": "",
		"redis":  redisBlock(fmt.Sprintf("algo%d:", time.Now().UnixNano()), redistest.ClusterAddrs(t)...),
	}
}

// TestLeakyBucketSpacesRequests: three requests at once at 10r/s with
// burst 2: the second waits its turn (100ms), the third two turns, a
// fourth finds the queue full.
func TestLeakyBucketSpacesRequests(t *testing.T) {
	for name, store := range stores(t) {
		t.Run(name, func(t *testing.T) {
			c := testcaddy.Start(t, "\trate_limit {\n"+store+`
		zone smooth {
			key       {client_ip}
			algorithm leaky_bucket
			rate      10r/s
			burst     2
		}
	}
	respond "ok"
`)
			type result struct {
				status int
				took   time.Duration
			}
			results := make([]result, 4)
			var wg sync.WaitGroup
			for i := range results {
				wg.Add(1)
				go func() {
					defer wg.Done()
					start := time.Now()
					resp, _, err := c.Get("/")
					if err != nil {
						t.Error(err)
						return
					}
					results[i] = result{resp.StatusCode, time.Since(start)}
				}()
			}
			wg.Wait()
			// Whatever order they arrive in: three pass, one after another
			// 100ms apart, and one is refused.
			var statuses []int
			var waits []time.Duration
			for _, r := range results {
				statuses = append(statuses, r.status)
				if r.status == 200 {
					waits = append(waits, r.took)
				}
			}
			slices.Sort(statuses)
			slices.Sort(waits)
			if fmt.Sprint(statuses) != "[200 200 200 429]" {
				t.Fatalf("statuses %v; want three 200 and one 429", statuses)
			}
			// Lower bounds only: a slow machine makes waits longer, never shorter.
			if waits[1] < 80*time.Millisecond || waits[2] < 180*time.Millisecond {
				t.Fatalf("waits %v; want about 0, 100ms and 200ms", waits)
			}
		})
	}
}

func TestLeakyBucketClientLeavesWhileWaiting(t *testing.T) {
	c := testcaddy.Start(t, `
	rate_limit {
		zone smooth {
			key       {client_ip}
			algorithm leaky_bucket
			rate      1r/s
			burst     5
		}
	}
	respond "ok"
`)
	if s := status(t, c.URL, "/", ""); s != 200 {
		t.Fatalf("first request: %d", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/", nil)
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("the second request should wait a second, past the client's timeout")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(c.Logs(), "client left while its request waited its turn") {
		if time.Now().After(deadline) {
			t.Fatalf("the handler did not give up on the client:\n%s", c.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// slowBackend answers a request once the test lets it go, by the request's
// X-Req header, and counts the requests in flight.
type slowBackend struct {
	URL    string
	mu     sync.Mutex
	active int
	gates  map[string]chan struct{}
}

func newSlowBackend(t *testing.T) *slowBackend {
	b := &slowBackend{gates: map[string]chan struct{}{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gate := b.gate(r.Header.Get("X-Req"))
		b.mu.Lock()
		b.active++
		b.mu.Unlock()
		defer func() { b.mu.Lock(); b.active--; b.mu.Unlock() }()
		select {
		case <-gate:
		case <-r.Context().Done():
		}
		w.Write([]byte("done"))
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	b.URL = l.Addr().String()
	return b
}

func (b *slowBackend) gate(id string) chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gates[id] == nil {
		b.gates[id] = make(chan struct{})
	}
	return b.gates[id]
}

// let answers the request id.
func (b *slowBackend) let(id string) { close(b.gate(id)) }

func (b *slowBackend) inFlight() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.active
}

func (b *slowBackend) waitInFlight(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.inFlight() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests in flight at the backend; want %d", b.inFlight(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConcurrencyLimit: two requests in flight per key; a third is
// refused; a slot comes back when a response ends and when a client goes
// away.
func TestConcurrencyLimit(t *testing.T) {
	for name, store := range stores(t) {
		t.Run(name, func(t *testing.T) {
			backend := newSlowBackend(t)
			c := testcaddy.Start(t, "\trate_limit {\n"+store+`
		zone in_flight {
			key            {http.request.header.X-API-Key}
			max_concurrent 2
		}
	}
	reverse_proxy `+backend.URL+`
`)
			send := func(ctx context.Context, key, id string) chan int {
				done := make(chan int, 1)
				go func() {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/", nil)
					req.Header.Set("X-API-Key", key)
					req.Header.Set("X-Req", id)
					resp, err := client.Do(req)
					if err != nil {
						done <- 0
						return
					}
					resp.Body.Close()
					done <- resp.StatusCode
				}()
				return done
			}
			bg := context.Background()
			first := send(bg, "k", "1")
			leaving, leave := context.WithCancel(bg)
			send(leaving, "k", "2")
			backend.waitInFlight(t, 2)
			if s := <-send(bg, "k", "3"); s != 429 {
				t.Fatalf("a third request of the key in flight: %d; want 429", s)
			}
			other := send(bg, "other", "4") // another key has slots of its own
			backend.waitInFlight(t, 3)
			backend.let("4")
			if s := <-other; s != 200 {
				t.Fatalf("another key: %d", s)
			}
			// A client leaves while its request is in flight: its slot comes back.
			leave()
			backend.waitInFlight(t, 1)
			var fifth chan int
			deadline := time.Now().Add(5 * time.Second)
			for {
				fifth = send(bg, "k", "5")
				select {
				case s := <-fifth:
					if s != 429 || time.Now().After(deadline) {
						t.Fatalf("after a client left: %d; want its slot back", s)
					}
					time.Sleep(20 * time.Millisecond) // the release may still be on its way
					continue
				case <-time.After(300 * time.Millisecond):
				}
				break
			}
			backend.waitInFlight(t, 2)
			// A response ends: its slot comes back.
			backend.let("1")
			if s := <-first; s != 200 {
				t.Fatalf("first request: %d", s)
			}
			sixth := send(bg, "k", "6")
			backend.waitInFlight(t, 2)
			backend.let("5")
			backend.let("6")
			if s1, s2 := <-fifth, <-sixth; s1 != 200 || s2 != 200 {
				t.Fatalf("requests 5 and 6: %d %d", s1, s2)
			}
		})
	}
}

// TestAlgorithmsThroughCaddy: each algorithm, chosen in the Caddyfile,
// passes 3 of 5 requests at once at 3r/m, on both stores.
func TestAlgorithmsThroughCaddy(t *testing.T) {
	for name, store := range stores(t) {
		t.Run(name, func(t *testing.T) {
			zones := ""
			algos := []string{"token_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter"}
			for _, a := range algos {
				zones += fmt.Sprintf("\t\tzone %[1]s {\n\t\t\tmatch {\n\t\t\t\tpath /%[1]s\n\t\t\t}\n\t\t\tkey {client_ip}\n\t\t\talgorithm %[1]s\n\t\t\trate 3r/m\n\t\t}\n", a)
			}
			c := testcaddy.Start(t, "\trate_limit {\n"+store+zones+"\t}\n\trespond \"ok\"\n")
			for _, a := range algos {
				var got []int
				for range 5 {
					got = append(got, status(t, c.URL, "/"+a, ""))
				}
				if fmt.Sprint(got) != "[200 200 200 429 429]" {
					t.Errorf("%s: %v", a, got)
				}
			}
		})
	}
}
