package errs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestJoin: nil for none, the error for one, else one line that wraps
// each, an errors.Join within included.
func TestJoin(t *testing.T) {
	if Join(nil, nil) != nil {
		t.Error("Join of nils is not nil")
	}
	a := errors.New("a")
	if Join(nil, a) != a {
		t.Error("Join of one error is not that error")
	}
	err := Join(fmt.Errorf("charge: %w", context.DeadlineExceeded), nil, errors.Join(errors.New("b"), errors.New("c")))
	if strings.Contains(err.Error(), "\n") || err.Error() != "charge: context deadline exceeded; b; c" {
		t.Errorf("Join = %q; want one line", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Error("Join hides what it wraps")
	}
}
