package ratelimit

import (
	"fmt"
	"slices"
	"strings"
)

// choices are the values an option accepts, declared once for both the
// Caddyfile parser and Provision. The empty value, "not set", is always
// accepted by check: it means the option's default.
type choices []string

// has reports whether v is one of c.
func (c choices) has(v string) bool { return slices.Contains(c, v) }

// check reports an error naming field when v is set and not one of c.
func (c choices) check(field, v string) error {
	if v == "" || c.has(v) {
		return nil
	}
	return c.refuse(field, v)
}

// refuse is the error of field's value v, which is not one of c.
func (c choices) refuse(field, v string) error {
	return fmt.Errorf("%s %q: want %s", field, v, c)
}

// String lists c as in "want a, b or c".
func (c choices) String() string {
	if len(c) < 2 {
		return strings.Join(c, "")
	}
	return strings.Join(c[:len(c)-1], ", ") + " or " + c[len(c)-1]
}

// checkRange reports an error naming field when n is not within lo..hi.
func checkRange(field string, n, lo, hi int) error {
	if n < lo || n > hi {
		return fmt.Errorf("%s %d: want %d to %d", field, n, lo, hi)
	}
	return nil
}

// aboutError is a configuration error about some of a block's
// subdirectives: a Caddyfile error points at the last of them written
// (the second of two that conflict).
type aboutError struct {
	options []string
	err     error
}

func (e *aboutError) Error() string { return e.err.Error() }
func (e *aboutError) Unwrap() error { return e.err }

// about is err, about options.
func about(err error, options ...string) error { return &aboutError{options, err} }
