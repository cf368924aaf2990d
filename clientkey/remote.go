package clientkey

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// The defaults of RemoteOptions.
const (
	DefaultFetchTimeout  = 10 * time.Second
	DefaultMaxKeySetSize = 1 << 20
	DefaultRefreshMin    = time.Minute
	DefaultRefreshMax    = time.Hour
	DefaultMaxStale      = 24 * time.Hour
)

// RemoteOptions say where a RemoteKeySet finds its keys and how often it
// fetches them. The zero value of a field is its default.
type RemoteOptions struct {
	// URL is the JWKS URL or, with Discover, the issuer. HTTPS, or HTTP to
	// a loopback host.
	URL string
	// Discover reads the JWKS URL from the issuer's OpenID Connect
	// discovery document, URL/.well-known/openid-configuration, whose
	// issuer must be URL.
	Discover bool
	// Timeout bounds one fetch: discovery and JWKS together.
	Timeout time.Duration
	// MaxSize is the longest response read, in bytes; longer ones are
	// rejected.
	MaxSize int64
	// RefreshMin is the shortest time between two fetches, whatever
	// causes them: a short Cache-Control max-age, unknown key IDs, a
	// failed fetch to try again.
	RefreshMin time.Duration
	// RefreshMax is the longest time between two fetches, and the time
	// between them when the response gives no max-age.
	RefreshMax time.Duration
	// MaxStale is how long the keys of the last good fetch are used while
	// fetches fail; older, they are not used.
	MaxStale time.Duration
	// Transport makes the requests. Default: a clone of
	// http.DefaultTransport.
	Transport http.RoundTripper
	// Now is the clock of ages and of the limit on fetches for unknown
	// key IDs. Default: time.Now.
	Now func() time.Time
	// Report is told of every fetch and of keys growing too old to use.
	// It is called from the set's goroutine, or once from Verify for
	// expired keys. Default: nothing.
	Report func(Event)
}

// Resolve returns o with its defaults, or an error saying what is wrong
// with it.
func (o RemoteOptions) Resolve() (RemoteOptions, error) {
	if _, err := CheckKeyURL(o.URL); err != nil {
		return o, err
	}
	set := func(d *time.Duration, dflt time.Duration) {
		if *d == 0 {
			*d = dflt
		}
	}
	set(&o.Timeout, DefaultFetchTimeout)
	set(&o.RefreshMin, DefaultRefreshMin)
	set(&o.RefreshMax, DefaultRefreshMax)
	set(&o.MaxStale, DefaultMaxStale)
	if o.MaxSize == 0 {
		o.MaxSize = DefaultMaxKeySetSize
	}
	switch {
	case o.Timeout < 0 || o.RefreshMin < 0 || o.MaxSize < 0:
		return o, errors.New("timeout, refresh_min and the size limit must be positive")
	case o.RefreshMax < o.RefreshMin:
		return o, fmt.Errorf("refresh_max %s is shorter than refresh_min %s", o.RefreshMax, o.RefreshMin)
	case o.MaxStale < o.RefreshMax:
		return o, fmt.Errorf("max_stale %s is shorter than refresh_max %s: keys would expire before their next refresh", o.MaxStale, o.RefreshMax)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Report == nil {
		o.Report = func(Event) {}
	}
	return o, nil
}

// EventKind says what an Event reports.
type EventKind int

const (
	// Fetched: a key set was fetched and is now in use.
	Fetched EventKind = iota
	// FetchFailed: a fetch failed; the keys in use, if any, stay.
	FetchFailed
	// KeysExpired: the keys in use are older than MaxStale and are no
	// longer used, until a fetch succeeds.
	KeysExpired
)

// Event is what a RemoteKeySet reports.
type Event struct {
	Kind EventKind
	// URL is the JWKS URL fetched: "" when discovery failed, and
	// RemoteOptions.URL for KeysExpired.
	URL string
	// Keys is how many keys are in use after a Fetched.
	Keys int
	// Changed is true when the fetched set differs from the one before.
	Changed bool
	// Skipped lists the keys of a fetched set that are not used, and why.
	Skipped []string
	// Err says why a fetch failed. errors.Is(Err, ErrKeySetRejected) when
	// the server answered with a set that cannot be used.
	Err error
	// Age is the age of the keys in use; HasKeys is false when there are
	// none.
	Age     time.Duration
	HasKeys bool
	// Next is the time until the next scheduled fetch.
	Next time.Duration
}

// RemoteKeySet holds the keys of a JWKS URL, fetched in the background:
// first when it is created, then on a schedule, and soon after a token
// names a key ID it lacks (see Refetch). Readers never wait on a fetch:
// they use the last good keys, up to MaxStale old.
type RemoteKeySet struct {
	opts   RemoteOptions
	client *http.Client
	keys   atomic.Pointer[keySnapshot]

	mu        sync.Mutex
	lastFetch time.Time // when the last fetch started, by opts.Now

	expired atomic.Bool   // KeysExpired was reported for the keys in use
	kick    chan struct{} // asks run to fetch now
	ctx     context.Context
	stop    context.CancelFunc
	ready   chan struct{} // closed when the first fetch is over
	done    chan struct{} // closed when run returns

	// Used by run's goroutine only.
	jwksURL string   // the discovered JWKS URL, "" until discovered
	hash    [32]byte // of the body of the keys in use
}

// keySnapshot is a key set in use, never changed once stored.
type keySnapshot struct {
	keys    []PublicKey
	fetched time.Time
}

// NewRemoteKeySet starts fetching the keys o names. Stop ends it.
func NewRemoteKeySet(o RemoteOptions) (*RemoteKeySet, error) {
	o, err := o.Resolve()
	if err != nil {
		return nil, err
	}
	transport := o.Transport
	if transport == nil {
		transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	r := &RemoteKeySet{
		opts:   o,
		client: &http.Client{Transport: transport, CheckRedirect: checkRedirect},
		kick:   make(chan struct{}, 1),
		ready:  make(chan struct{}),
		done:   make(chan struct{}),
	}
	r.ctx, r.stop = context.WithCancel(context.Background())
	go r.run()
	return r, nil
}

// Ready is closed once the first fetch is over, whatever its outcome.
func (r *RemoteKeySet) Ready() <-chan struct{} { return r.ready }

// Done is closed once the set's goroutine has ended, after Stop.
func (r *RemoteKeySet) Done() <-chan struct{} { return r.done }

// Stop ends the fetches, a fetch under way included, and waits for the
// set's goroutine to end.
func (r *RemoteKeySet) Stop() {
	r.stop()
	<-r.done
	r.client.CloseIdleConnections()
}

// Age is the age of the keys in use; ok is false when none were fetched.
func (r *RemoteKeySet) Age() (age time.Duration, ok bool) {
	s := r.keys.Load()
	if s == nil {
		return 0, false
	}
	return r.opts.Now().Sub(s.fetched), true
}

// current returns the keys to verify with, or nil when there are none or
// they are older than MaxStale (reported once).
func (r *RemoteKeySet) current() *keySnapshot {
	s := r.keys.Load()
	if s == nil {
		return nil
	}
	age := r.opts.Now().Sub(s.fetched)
	if age <= r.opts.MaxStale {
		return s
	}
	if r.expired.CompareAndSwap(false, true) {
		r.opts.Report(Event{Kind: KeysExpired, URL: r.opts.URL, Age: age, HasKeys: true})
	}
	return nil
}

// Refetch asks for a fetch soon, when a token names a key ID that the set
// lacks, and returns at once. It is a no-op when the last fetch started
// less than RefreshMin ago: tokens with made-up key IDs cannot make the set
// fetch more often than that.
func (r *RemoteKeySet) Refetch() {
	now := r.opts.Now()
	r.mu.Lock()
	if now.Sub(r.lastFetch) < r.opts.RefreshMin {
		r.mu.Unlock()
		return
	}
	r.lastFetch = now
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// run fetches at once, then whenever the schedule or Refetch says, until
// Stop.
func (r *RemoteKeySet) run() {
	defer close(r.done)
	r.markFetch()
	timer := time.NewTimer(r.refresh())
	defer timer.Stop()
	close(r.ready)
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-timer.C:
			r.markFetch()
		case <-r.kick: // Refetch marked it
			timer.Stop()
		}
		timer.Reset(r.refresh())
	}
}

// markFetch records that a fetch starts now.
func (r *RemoteKeySet) markFetch() {
	now := r.opts.Now()
	r.mu.Lock()
	r.lastFetch = now
	r.mu.Unlock()
}

// refresh fetches the set once, uses it if it is good, reports, and
// returns the time until the next fetch.
func (r *RemoteKeySet) refresh() time.Duration {
	ctx, cancel := context.WithTimeout(r.ctx, r.opts.Timeout)
	defer cancel()
	ev, body, next := r.fetch(ctx)
	ev.Next = next
	if ev.Err == nil {
		hash := sha256.Sum256(body)
		ev.Changed = !bytes.Equal(hash[:], r.hash[:])
		r.hash = hash
		r.expired.Store(false)
	} else {
		r.jwksURL = "" // discover again next time: the JWKS may have moved
		next = r.opts.RefreshMin
		ev.Next = next
	}
	ev.Age, ev.HasKeys = r.Age()
	if r.ctx.Err() == nil { // not stopping
		r.opts.Report(ev)
	}
	return next
}

// fetch gets the set (discovering its URL first if need be) and, if it
// is good, puts it in use. It returns the event to report, the body read,
// and when to fetch next after a good fetch.
func (r *RemoteKeySet) fetch(ctx context.Context) (ev Event, body []byte, next time.Duration) {
	ev.Kind = FetchFailed
	if r.jwksURL == "" {
		if !r.opts.Discover {
			r.jwksURL = r.opts.URL
		} else if r.jwksURL, ev.Err = r.discover(ctx); ev.Err != nil {
			return ev, nil, 0
		}
	}
	ev.URL = r.jwksURL
	body, header, err := r.get(ctx, r.jwksURL, "application/jwk-set+json, application/json")
	if err != nil {
		ev.Err = err
		return ev, nil, 0
	}
	keys, skipped, err := ParseJWKS(body)
	ev.Skipped = skipped
	if err != nil {
		ev.Err = err
		return ev, nil, 0
	}
	r.keys.Store(&keySnapshot{keys: keys, fetched: r.opts.Now()})
	ev.Kind, ev.Keys = Fetched, len(keys)
	return ev, body, refreshAfter(header, r.opts.RefreshMin, r.opts.RefreshMax)
}
