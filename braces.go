package ratelimit

import (
	"fmt"
	"regexp"
)

// Caddy's replacer reads a template's braces this way: \{ and \} are
// literal braces; an unescaped { opens a placeholder, which the next
// unescaped } closes; a { that nothing closes, and a } that closes
// nothing, are kept as text. A key such as {http.request.header.X-Key,
// missing its }, is therefore the same text for every request: one bucket
// for every client. checkBraces refuses such templates.

// checkBraces refuses a template whose braces do not balance: a { without
// its }, a } without its {, a { inside a placeholder, an empty {}. The
// error names field and tmpl, and the template to write instead.
func checkBraces(field, tmpl string) error {
	open, closed := -1, 0 // the { of the placeholder being read; where text after the last one starts
	for i := 0; i < len(tmpl); i++ {
		c := tmpl[i]
		if c == '\\' && i+1 < len(tmpl) && (tmpl[i+1] == '{' || tmpl[i+1] == '}') {
			i++ // literal, inside a placeholder's name too
			continue
		}
		switch {
		case c == '{' && open >= 0:
			return unclosedBrace(field, tmpl, open, i)
		case c == '{':
			open = i
		case c == '}' && open < 0:
			return strayBrace(field, tmpl, closed, i)
		case c == '}' && open == i-1:
			return fmt.Errorf("%s %q: {} names no placeholder: write a placeholder's name between the braces, "+
				`or \{\} for literal braces`, field, tmpl)
		case c == '}':
			open, closed = -1, i+1
		}
	}
	if open >= 0 {
		return unclosedBrace(field, tmpl, open, len(tmpl))
	}
	return nil
}

// unclosedBrace is the error of a { at open that is not closed before
// end: the fix closes it there.
func unclosedBrace(field, tmpl string, open, end int) error {
	return fmt.Errorf(`%s %q: %s has no closing }, so Caddy does not replace it and keeps it as text; write %s, `+
		`or \{ for a literal brace`, field, tmpl, tmpl[open:end], tmpl[:end]+"}"+tmpl[end:])
}

// bareName is text that reads as a placeholder's name without its braces.
var bareName = regexp.MustCompile(`^[A-Za-z][\w.-]*$`)

// strayBrace is the error of a } at i that closes no placeholder, where
// the text since the last placeholder starts at from: the fix puts that
// text in braces when it reads as a placeholder's name
// (header.X-Key}), else leaves the } out.
func strayBrace(field, tmpl string, from, i int) error {
	fix := tmpl[:i] + tmpl[i+1:]
	if name := tmpl[from:i]; bareName.MatchString(name) {
		fix = tmpl[:from] + "{" + name + "}" + tmpl[i+1:]
	}
	return fmt.Errorf(`%s %q: a } that closes no placeholder, which Caddy keeps as text; write %s, `+
		`or \} for a literal brace`, field, tmpl, fix)
}
