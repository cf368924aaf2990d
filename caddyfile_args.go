package ratelimit

import (
	"fmt"
	"iter"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// The argument readers of caddyfile.go's parsers. Each reads the
// arguments of the subdirective at d's current token and reports what is
// wrong with d.Err, so that errors carry the line.

// oneOf reads a single argument that must be one of allowed.
func oneOf(d *caddyfile.Dispenser, dst *string, allowed choices) error {
	name := d.Val()
	if err := oneArg(d, dst); err != nil {
		return err
	}
	if !allowed.has(*dst) { // in a Caddyfile, "" is no value either
		return d.Err(allowed.refuse(name, *dst).Error())
	}
	return nil
}

// durationArg reads a single duration argument of at least min; msg
// (with a %q for the argument) says what is wrong otherwise.
func durationArg(d *caddyfile.Dispenser, min time.Duration, msg string) (caddy.Duration, error) {
	var s string
	if err := oneArg(d, &s); err != nil {
		return 0, err
	}
	t, err := caddy.ParseDuration(s)
	if err != nil || t < min {
		return 0, d.Errf(msg, s)
	}
	return caddy.Duration(t), nil
}

// templateArgs reads "<template> [<default>]" and reports whether the
// template holds placeholders.
func templateArgs(d *caddyfile.Dispenser) (tmpl, dflt string, err error) {
	args := d.RemainingArgs()
	if len(args) == 0 || len(args) > 2 {
		return "", "", d.ArgErr()
	}
	if len(args) == 2 {
		if !strings.ContainsAny(args[0], "{}") { // a stray } is checkPlaceholders' to report
			if _, _, err := bucket.ParseRate(args[0] + args[1]); err == nil {
				return "", "", d.Errf("%s %s: write a rate without spaces: %s%s", args[0], args[1], args[0], args[1])
			}
			return "", "", d.Errf("%s %s: one value expected; a second one is only the default of a placeholder, "+
				"as in rate {plan_rate} 100r/m", args[0], args[1])
		}
		dflt = args[1]
	}
	return args[0], dflt, nil
}

// oneArg reads the single argument of the current subdirective into dst.
func oneArg(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// noArgs sets a flag subdirective, which takes no argument.
func noArgs(d *caddyfile.Dispenser, dst *bool) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	*dst = true
	return nil
}

// intArg reads a single whole-number argument of at least min.
func intArg(d *caddyfile.Dispenser, dst *int, min int) error {
	name, s := d.Val(), ""
	if err := oneArg(d, &s); err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < min {
		return d.Errf("%s %q: want a whole number of at least %d", name, s, min)
	}
	*dst = n
	return nil
}

// unmarshalOnce parses a sub-config's block (or line) from a dispenser of
// its own into a new *dst; twice is an error, already.
func unmarshalOnce[T any, PT interface {
	*T
	caddyfile.Unmarshaler
}](d *caddyfile.Dispenser, dst *PT, already string) error {
	if *dst != nil {
		return d.Err(already)
	}
	*dst = PT(new(T))
	return (*dst).UnmarshalCaddyfile(d.NewFromNextSegment())
}

// withStringOptions adds to options a subdirective for each of names that
// reads its one argument, which may not be empty, into the string field of
// T with that JSON name, and returns options. A name that is no such field
// panics, when the package is initialised.
func withStringOptions[T any](options map[string]func(*caddyfile.Dispenser, *T) error, names ...string) map[string]func(*caddyfile.Dispenser, *T) error {
	typ := reflect.TypeFor[T]()
	for _, name := range names {
		i := slices.IndexFunc(reflect.VisibleFields(typ), func(f reflect.StructField) bool {
			json, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			return json == name && f.Type.Kind() == reflect.String
		})
		if i < 0 {
			panic(fmt.Sprintf("%s has no string field %q", typ, name))
		}
		options[name] = func(d *caddyfile.Dispenser, v *T) error {
			dst := reflect.ValueOf(v).Elem().Field(i).Addr().Interface().(*string)
			if err := oneArg(d, dst); err != nil {
				return err
			}
			if *dst == "" {
				return d.Errf("%s is empty: a {$VAR} is replaced when the Caddyfile is read, and an unset variable "+
					"leaves nothing; set it, or write {env.VAR} to read it when the config loads", name)
			}
			return nil
		}
	}
	return options
}

// didYouMean is ": did you mean <name>?" for the one of names closest to
// word (at most 2 edits, or a third of its length), or "".
func didYouMean(word string, names iter.Seq[string]) string {
	best, bestDist := "", min(2, len(word)/3)+1
	for name := range names {
		if d := editDistance(word, name); d < bestDist || d == bestDist && name < best {
			best, bestDist = name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(": did you mean %s?", best)
}

// editDistance is the Levenshtein distance of a and b, with a swap of two
// neighbours counting as one edit (brust: burst).
func editDistance(a, b string) int {
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
