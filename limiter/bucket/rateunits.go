package bucket

import (
	"fmt"
	"strings"
)

// unitWords are the words for a rate's units that are not its units
// (100r/min), by the unit meant.
var unitWords = map[string]string{"sec": "s", "secs": "s", "second": "s", "seconds": "s",
	"min": "m", "mins": "m", "minute": "m", "minutes": "m", "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
	"day": "d", "days": "d"}

// unitWordHint is err, parseRate's error for s, said again for a unit
// written as a word (100r/min): it names the word and the rate meant
// (write 100r/m). Other errors are err.
func unitWordHint(s string, err error) error {
	count, per, _ := strings.Cut(s, "r/")
	word := strings.TrimLeft(per, "0123456789")
	mult := per[:len(per)-len(word)]
	unit, ok := unitWords[strings.ToLower(word)]
	switch {
	case !ok && len(word) >= 3 && strings.Trim(strings.ToLower(word), "abcdefghijklmnopqrstuvwxyz") == "":
		return fmt.Errorf("rate %q: unknown unit %q (want s, m, h or d)", s, word)
	case !ok: // a unit below a second (10r/ms), a number: parseRate says
		return err
	}
	meant := count + "r/" + mult + unit
	if _, _, err := parseRate(meant); err != nil {
		return fmt.Errorf("rate %q: unknown unit %q (want s, m, h or d); %w", s, word, err)
	}
	return fmt.Errorf("rate %q: unknown unit %q: write %s", s, word, meant)
}
