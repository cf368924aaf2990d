// Package errs joins errors on one line: errors.Join separates them with
// newlines, which a log field (a JSON string, a terminal line) should not
// carry.
package errs

import "strings"

// Join is the errors of errs that are not nil, as one: nil when none, the
// error itself when one, else an error whose message is theirs separated
// by "; " and which wraps them all (errors.Is and errors.As see each).
func Join(errs ...error) error {
	var kept []error
	for _, err := range errs {
		if err != nil {
			kept = append(kept, err)
		}
	}
	switch len(kept) {
	case 0:
		return nil
	case 1:
		return kept[0]
	}
	return joined(kept)
}

type joined []error

func (j joined) Error() string {
	msgs := make([]string, len(j))
	for i, err := range j {
		msgs[i] = strings.ReplaceAll(err.Error(), "\n", "; ")
	}
	return strings.Join(msgs, "; ")
}

func (j joined) Unwrap() []error { return j }
