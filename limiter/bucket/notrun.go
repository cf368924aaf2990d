package bucket

import "errors"

// NotRunError is the error of a call that a store never sent, so that it
// charged nothing: an open circuit breaker, a full queue, a call whose
// time was up before it left.
type NotRunError struct{ Msg string }

func (e *NotRunError) Error() string { return e.Msg }

// NotRun reports that the call charged nothing.
func (e *NotRunError) NotRun() bool { return true }

// MayHaveRun reports whether a store call that failed with err may have
// run (and so charged its buckets, or taken a concurrency slot to give
// back): false for an error whose NotRun method returns true (a
// NotRunError, or a storage fleet's stale round), true for any other, such
// as a time-out after the call was sent.
func MayHaveRun(err error) bool {
	var notRun interface{ NotRun() bool }
	return !errors.As(err, &notRun) || !notRun.NotRun()
}
