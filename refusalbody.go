package ratelimit

// The 429 of a refusal: its body (JSON or problem details) or handle_errors'
// error, and what a zone's responses show that its policy fixes, written
// once (zoneShown, policyText).

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// refuse answers 429 as the Response option says: the body is the
// policy's start (policyText), the wait, the zone's end, written into a
// pooled buffer. A request that can never pass gets no Retry-After. With
// the IETF fields, a client that accepts application/problem+json gets
// the draft's quota-exceeded problem type instead, naming the policies
// that zones, of verdict v, violated (refusalForm).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, f *headerFields, o outcome, zones []*Zone, v *limiter.Verdict) error {
	if h.Response == "handle_errors" {
		if o.impossible {
			return caddyhttp.Error(http.StatusTooManyRequests, fmt.Errorf("%w: the request costs %d, over the zone's limit of %d",
				o.z.shown.exceeded, o.req.Cost, o.req.Policy.Limit()))
		}
		f.set(hdrRetryAfter, strconv.FormatInt(o.retry, 10))
		return caddyhttp.Error(http.StatusTooManyRequests, o.z.shown.exceeded)
	}
	buf := bodies.Get().(*[]byte)
	body, contentType := appendRefusal((*buf)[:0], o, h.refusalForm(w.Header(), r), zones, v)
	var room [40]byte
	nums := room[:0]
	if !o.impossible {
		nums = strconv.AppendInt(nums, o.retry, 10)
	}
	cut := len(nums)
	s := f.text(strconv.AppendInt(nums, int64(len(body)), 10))
	if cut > 0 {
		f.set(hdrRetryAfter, s[:cut])
	}
	f.set(hdrContentType, contentType)
	f.set(hdrContentLength, s[cut:])
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body) // a client that left needs no answer
	*buf = body
	bodies.Put(buf)
	return nil
}

// The forms of a 429 body: JSON, problem details (about:blank), and
// problem details of the IETF draft's quota-exceeded type.
const (
	formJSON = iota
	formProblem
	formQuota
)

// refusalForm is the form of the body that refuses r: the Response
// option's (JSON, or about:blank problem details with response problem),
// unless the handler sends the IETF fields and r accepts
// application/problem+json, which then gets the draft's quota-exceeded
// type. The form then depends on Accept, which hdr's Vary says.
func (h *Handler) refusalForm(hdr http.Header, r *http.Request) int {
	if h.ietfFields() {
		hdr.Add("Vary", "Accept")
		if acceptsProblem(r) {
			return formQuota
		}
	}
	if h.Response == "problem" {
		return formProblem
	}
	return formJSON
}

// appendRefusal appends o's 429 body in form, and says its Content-Type:
// the message and the wait, the zone and retry_after; for a ban (or a
// key's block), banned and its end; for a request that can never pass,
// its cost and the limit instead of a wait. A quota-exceeded body names
// the violated policies after the message.
func appendRefusal(b []byte, o outcome, form int, zones []*Zone, v *limiter.Verdict) ([]byte, string) {
	contentType := "application/json"
	if form != formJSON {
		contentType = "application/problem+json"
	}
	if o.impossible {
		return appendImpossible(b, o, form, zones, v), contentType
	}
	problem := btoi(form != formJSON)
	head := o.text.json
	switch {
	case o.banned && o.req.Block > 0:
		head = blockText[problem]
	case o.banned:
		head = o.text.ban[problem]
	case problem == 1:
		head = o.text.problem
	}
	if form == formQuota { // the message after the about:blank start
		b, head = append(b, quotaExceededStart...), head[len(bodyStart[1]):]
	}
	quota := o.req.Policy.Algorithm == limiter.Quota && !o.banned
	b = append(b, head...)
	if quota { // when it resets, in its time zone (zonequota.go)
		b = appendQuotaReset(b, o.req.Policy, o.d.Reset)
	}
	b = append(appendSeconds(b, o.retry), `."`...)
	if form == formQuota {
		b = violatedPolicies(b, o, zones, v)
	}
	b = strconv.AppendInt(append(b, o.z.shown.bodyEnd...), o.retry, 10)
	if quota {
		b = o.d.Reset.In(o.req.Policy.Calendar.Location()).AppendFormat(append(b, `,"resets_at":"`...), time.RFC3339)
		b = append(b, '"')
	}
	if o.banned {
		b = strconv.AppendInt(append(b, `,"banned":true,"banned_until":`...), o.d.ResetUnix(), 10)
	}
	return append(b, "}\n"...), contentType
}

// appendImpossible appends the body of o, a request whose cost exceeds
// its zone's limit: it names both, and promises no wait.
func appendImpossible(b []byte, o outcome, form int, zones []*Zone, v *limiter.Verdict) []byte {
	p := o.req.Policy
	msg, _ := json.Marshal(fmt.Sprintf("This request costs %d, more than the limit of %d (%s) admits at once: it is refused however long it waits.",
		o.req.Cost, p.Limit(), p))
	if form == formQuota {
		b = violatedPolicies(append(append(b, quotaExceededStart...), msg...), o, zones, v)
	} else {
		b = append(append(b, bodyStart[btoi(form != formJSON)]...), msg...)
	}
	b = append(append(b, `,"zone":`...), o.z.shown.zoneJSON...)
	b = strconv.AppendInt(append(b, `,"cost":`...), o.req.Cost, 10)
	b = strconv.AppendInt(append(b, `,"limit":`...), p.Limit(), 10)
	return append(b, "}\n"...)
}

// bodyStart are the starts of the 429 bodies, JSON's and problem
// details', up to the message's string; blockText those of a key's block,
// up to the wait.
var (
	bodyStart = [2]string{`{"error":"rate limit exceeded","message":`,
		`{"type":"about:blank","title":"Too Many Requests","status":429,"detail":`}
	blockText = [2][]byte{[]byte(bodyStart[0] + blockMessage), []byte(bodyStart[1] + blockMessage)}
)

const blockMessage = `"Your requests are blocked in this zone. Try again in `

// bodies are the buffers 429 bodies are written into (Write does not keep
// what it is given).
var bodies = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// appendSeconds appends n seconds in words: "1 second", "<n> seconds".
func appendSeconds(b []byte, n int64) []byte {
	if n == 1 {
		return append(b, "1 second"...)
	}
	return append(strconv.AppendInt(b, n, 10), " seconds"...)
}

// zoneShown is what a zone's responses show that does not change from one
// request to the next, written once.
type zoneShown struct {
	name     any    // the zone's name, for {http.rate_limit.zone}
	quoted   string // the name as a Structured Field String, for the IETF fields (ietf.go)
	bodyEnd  string // the 429 bodies after the message: ,"zone":"<name>","retry_after":
	zoneJSON string // the name as a JSON string, also in violated-policies
	exceeded error  // handle_errors' error
	static   *policyText
	// others are the texts of policies from placeholders, at most
	// maxPolicyTexts; the map is replaced, never changed.
	others atomic.Pointer[map[limiter.Policy]*policyText]
}

// maxPolicyTexts bounds the policies from placeholders whose texts a zone
// keeps; the others are written per request.
const maxPolicyTexts = 64

// init writes what the responses of zone name show, and the texts of its
// static policy (or default one).
func (s *zoneShown) init(name string, static limiter.Policy) {
	s.name, s.quoted = name, strconv.Quote(name) // fmt's %q
	zone, _ := json.Marshal(name)
	s.zoneJSON = string(zone)
	s.bodyEnd = `,"zone":` + s.zoneJSON + `,"retry_after":`
	s.exceeded = fmt.Errorf("rate limit exceeded in zone %q", name)
	s.static = newPolicyText(s.quoted, static)
}

// text is policy p's text in the zone.
func (s *zoneShown) text(p limiter.Policy) *policyText {
	if p == s.static.policy {
		return s.static
	}
	others := s.others.Load()
	if others != nil {
		if t, ok := (*others)[p]; ok {
			return t
		}
	}
	t := newPolicyText(s.quoted, p)
	if others == nil || len(*others) < maxPolicyTexts {
		m := map[limiter.Policy]*policyText{p: t}
		if others != nil {
			maps.Copy(m, *others)
		}
		s.others.CompareAndSwap(others, &m) // or another request's map stays
	}
	return t
}

// policyText is what responses show that a zone's policy fixes, written
// once: its limit, RateLimit-Policy, and the 429 bodies up to the wait.
type policyText struct {
	policy     limiter.Policy
	limit      int64  // policy.Limit()
	limitValue any    // limit, for {http.rate_limit.limit}
	limitText  string // limit, for X-RateLimit-Limit
	quota      string // RateLimit-Policy for limit
	// json and problem are the bodies (as json.Marshal writes them) up to
	// the wait in the message, whose string goes on.
	json, problem []byte
	// ban is the same for the refusal of a banned client: JSON's, then
	// problem details'.
	ban [2][]byte
}

func newPolicyText(quoted string, p limiter.Policy) *policyText {
	t := &policyText{policy: p, limit: p.Limit(), limitText: strconv.FormatInt(p.Limit(), 10)}
	msg := messageStart("You have exceeded the rate limit of " + p.String() + ". Try again in ")
	if p.Algorithm == limiter.Quota {
		msg = messageStart("You have used the quota of " + p.String() + ". It resets at ")
	}
	ban := messageStart("You are banned for exceeding the rate limit of " + p.String() + " too often. Try again in ")
	t.json, t.problem = append([]byte(bodyStart[0]), msg...), append([]byte(bodyStart[1]), msg...)
	t.ban = [2][]byte{append([]byte(bodyStart[0]), ban...), append([]byte(bodyStart[1]), ban...)}
	t.limitValue = t.limit
	t.quota = string(appendQuota(nil, quoted, p, t.limit))
	return t
}

// messageStart is s as a JSON string that goes on: without its closing
// quote.
func messageStart(s string) []byte {
	b, _ := json.Marshal(s)
	return b[:len(b)-1]
}

// limitField is X-RateLimit-Limit for a decision's limit n.
func (t *policyText) limitField(n int64) string {
	if n == t.limit {
		return t.limitText
	}
	return strconv.FormatInt(n, 10)
}
