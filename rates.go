package ratelimit

import (
	"fmt"
	"strings"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// unitWords are the words for a rate's units that are not its units
// (100r/min), by the unit meant.
var unitWords = map[string]string{"sec": "s", "secs": "s", "second": "s", "seconds": "s",
	"min": "m", "mins": "m", "minute": "m", "minutes": "m", "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
	"day": "d", "days": "d"}

// parseRate is limiter.ParseRate for a zone's configured rate, whose
// error, for a unit written as a word (100r/min), names the word and the
// rate meant (write 100r/m).
func parseRate(s string) (int64, time.Duration, error) {
	n, period, err := limiter.ParseRate(s)
	if err == nil {
		return n, period, nil
	}
	count, per, _ := strings.Cut(s, "r/")
	word := strings.TrimLeft(per, "0123456789")
	mult := per[:len(per)-len(word)]
	unit, ok := unitWords[strings.ToLower(word)]
	switch {
	case !ok && len(word) >= 3 && strings.Trim(strings.ToLower(word), "abcdefghijklmnopqrstuvwxyz") == "":
		return 0, 0, fmt.Errorf("rate %q: unknown unit %q (want s, m, h or d)", s, word)
	case !ok: // a unit below a second (10r/ms), a number: ParseRate says
		return 0, 0, err
	}
	meant := count + "r/" + mult + unit
	if _, _, err := limiter.ParseRate(meant); err != nil {
		return 0, 0, fmt.Errorf("rate %q: unknown unit %q (want s, m, h or d); %w", s, word, err)
	}
	return 0, 0, fmt.Errorf("rate %q: unknown unit %q: write %s", s, word, meant)
}
