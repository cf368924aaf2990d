package ratelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// The docs' code blocks are examples a user copies, so each is checked:
//
//   - ```caddyfile: a whole Caddyfile; it adapts with this module, and
//     Caddy's formatter leaves it as it is (no "not formatted" warning);
//   - ```caddyfile site: directives of a site block; wrapped in a site
//     block, it adapts; the fragment itself is formatted;
//   - ```caddyfile syntax: a syntax block with <placeholders>; formatted;
//   - ```json: valid JSON; an object whose handler is rate_limit decodes
//     into Handler with no unknown field, and provisions.
//
// Caddyfile.example is a whole Caddyfile too.

// docFiles are the Markdown files users and contributors read.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"README.md", "ARCHITECTURE.md", "BENCHMARKS.md", "CONTRIBUTING.md"} {
		if _, err := os.Stat(f); err == nil {
			files = append(files, f)
		}
	}
	return files
}

// codeBlock is a fenced code block of a Markdown file.
type codeBlock struct {
	file string
	line int    // the line of its opening fence
	info string // the fence's info string: "caddyfile site"
	body string
}

func (b codeBlock) String() string { return fmt.Sprintf("%s:%d (%s)", b.file, b.line, b.info) }

// codeBlocks returns the fenced code blocks of the Markdown text md.
func codeBlocks(file, md string) []codeBlock {
	var blocks []codeBlock
	var cur *codeBlock
	for i, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &codeBlock{file: file, line: i + 1, info: strings.TrimSpace(strings.TrimPrefix(trimmed, "```"))}
		case cur != nil && trimmed == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.body += line + "\n"
		}
	}
	return blocks
}

func TestDocExamples(t *testing.T) {
	var blocks []codeBlock
	for _, f := range docFiles(t) {
		md, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, codeBlocks(f, string(md))...)
	}
	example, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	blocks = append(blocks, codeBlock{file: "Caddyfile.example", line: 1, info: "caddyfile", body: string(example)})
	counts := map[string]int{}
	for _, b := range blocks {
		kind := strings.ToLower(b.info)
		counts[kind]++
		if err := checkBlock(t, kind, b.body); err != nil {
			t.Errorf("%s: %v", b, err)
		}
	}
	t.Logf("checked: %v", counts)
}

// checkBlock checks one block of the kind its info string names.
func checkBlock(t *testing.T, kind, body string) error {
	switch kind {
	case "caddyfile":
		return checkCaddyfile(t, body, body)
	case "caddyfile site":
		return checkCaddyfile(t, body, inSite(body))
	case "caddyfile syntax":
		return checkFormatted(body)
	case "json":
		return checkJSON(t, body)
	}
	if first, _, _ := strings.Cut(kind, " "); first == "caddyfile" || first == "caddy" || first == "caddy-d" {
		return fmt.Errorf("unknown kind of Caddyfile block: want caddyfile, caddyfile site or caddyfile syntax")
	}
	return nil
}

// inSite wraps the directives of a site block in one.
func inSite(body string) string {
	var b strings.Builder
	b.WriteString(":8080 {\n")
	for _, line := range strings.Split(strings.TrimRight(body, "\n"), "\n") {
		if line != "" {
			b.WriteString("\t")
		}
		b.WriteString(line + "\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// checkFormatted fails when Caddy's formatter would change src.
func checkFormatted(src string) error {
	formatted := string(caddyfile.Format([]byte(src)))
	if formatted == src {
		return nil
	}
	got, want := strings.Split(src, "\n"), strings.Split(formatted, "\n")
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Errorf("not formatted: line %d is %q, caddy fmt makes it %q", i+1, got[i], want[i])
		}
	}
	return fmt.Errorf("not formatted: caddy fmt changes the line count or final newline")
}

// checkCaddyfile checks that shown is formatted, that full adapts, and
// that the rate_limit handlers it adapts to provision.
func checkCaddyfile(t *testing.T, shown, full string) error {
	if err := checkFormatted(shown); err != nil {
		return err
	}
	out, err := adapt(t, full)
	if err != nil {
		return fmt.Errorf("does not adapt: %w", err)
	}
	for _, h := range rateLimitHandlers([]byte(out)) {
		if err := checkHandler(t, h); err != nil {
			return err
		}
	}
	return nil
}

// checkJSON checks that body is JSON and that a rate_limit handler in it
// is valid.
func checkJSON(t *testing.T, body string) error {
	if !json.Valid([]byte(body)) {
		var v any
		return fmt.Errorf("not JSON: %v", json.Unmarshal([]byte(body), &v))
	}
	for _, h := range rateLimitHandlers([]byte(body)) {
		if err := checkHandler(t, h); err != nil {
			return err
		}
	}
	return nil
}

// rateLimitHandlers returns every JSON object in doc whose "handler" is
// "rate_limit", however deep.
func rateLimitHandlers(doc []byte) []json.RawMessage {
	var found []json.RawMessage
	var walk func(raw json.RawMessage)
	walk = func(raw json.RawMessage) {
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) == nil {
			if string(obj["handler"]) == `"rate_limit"` {
				found = append(found, raw)
				return
			}
			for _, v := range obj {
				walk(v)
			}
			return
		}
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) == nil {
			for _, v := range list {
				walk(v)
			}
		}
	}
	walk(doc)
	return found
}

// envPlaceholder finds {env.NAME} placeholders.
var envPlaceholder = regexp.MustCompile(`\{env\.([A-Za-z_][A-Za-z0-9_]*)\}`)

// checkHandler decodes raw into a Handler, refusing unknown fields, and
// provisions it when that needs nothing from outside: a handler with Redis,
// or JWT keys from a file or a URL, is only decoded. Environment variables it names are set
// to a 32-character value for the test.
func checkHandler(t *testing.T, raw json.RawMessage) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return err
	}
	delete(obj, "handler")
	rest, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(rest))
	dec.DisallowUnknownFields()
	var h Handler
	if err := dec.Decode(&h); err != nil {
		return fmt.Errorf("rate_limit handler: %w", err)
	}
	if h.Redis != nil || (h.JWT != nil && h.JWT.Secret == "") {
		return nil // Redis, key files and key sets are not here
	}
	for _, m := range envPlaceholder.FindAllStringSubmatch(string(raw), -1) {
		if _, set := os.LookupEnv(m[1]); !set {
			t.Setenv(m[1], strings.Repeat("s3cr3t-", 5))
		}
	}
	if err := provision(t, &h); err != nil {
		return fmt.Errorf("rate_limit handler does not provision: %w", err)
	}
	return nil
}

// TestDocLinks checks that every relative link of the docs leads to a file
// that exists and, with a #fragment, to one of its headings.
func TestDocLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, f := range docFiles(t) {
		md, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(withoutCode(string(md)), "\n") {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				if err := checkLink(f, m[1]); err != nil {
					t.Errorf("%s:%d: link %s: %v", f, i+1, m[1], err)
				}
			}
		}
	}
}

// checkLink checks the relative link target found in the file from.
func checkLink(from, target string) error {
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return nil
	}
	path, fragment, _ := strings.Cut(target, "#")
	file := from
	if path != "" {
		file = filepath.Join(filepath.Dir(from), path)
	}
	body, err := os.ReadFile(file)
	if err != nil {
		if _, statErr := os.Stat(file); statErr == nil && fragment == "" {
			return nil // a folder
		}
		return fmt.Errorf("no such file")
	}
	if fragment == "" || !strings.HasSuffix(file, ".md") {
		return nil
	}
	for _, a := range anchors(string(body)) {
		if a == fragment {
			return nil
		}
	}
	return fmt.Errorf("no heading with anchor #%s in %s", fragment, file)
}

// anchors returns the anchors GitHub gives the headings of md.
func anchors(md string) []string {
	var out []string
	seen := map[string]int{}
	for _, line := range strings.Split(withoutCode(md), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range text {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			a = fmt.Sprintf("%s-%d", a, n)
		}
		seen[b.String()]++
		out = append(out, a)
	}
	return out
}

// withoutCode blanks the lines of md's fenced code blocks, keeping the
// line count.
func withoutCode(md string) string {
	lines := strings.Split(md, "\n")
	in := false
	for i, line := range lines {
		fence := strings.HasPrefix(strings.TrimSpace(line), "```")
		if in || fence {
			lines[i] = ""
		}
		if fence {
			in = !in
		}
	}
	return strings.Join(lines, "\n")
}

// TestDocsSayWhatIs checks that the docs describe the system, not how it
// came to be, and that the README stays a short way in.
func TestDocsSayWhatIs(t *testing.T) {
	history := regexp.MustCompile(`(?i)\b(the session|session before|last session|the issue|this issue|the review|reviewer|as measured before)\b`)
	commit := regexp.MustCompile(`\b[0-9a-f]{7,12}\b`)
	for _, f := range docFiles(t) {
		md, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(withoutCode(string(md)), "\n") {
			if m := history.FindString(line); m != "" {
				t.Errorf("%s:%d: %q tells the project's history: say what the system does", f, i+1, m)
			}
			for _, h := range commit.FindAllString(line, -1) {
				if strings.ContainsAny(h, "0123456789") && strings.ContainsAny(h, "abcdef") {
					t.Errorf("%s:%d: %q looks like a commit hash: a figure carries its date, machine and command", f, i+1, h)
				}
			}
		}
	}
	if fi, err := os.Stat("README.md"); err != nil {
		t.Fatal(err)
	} else if fi.Size() > 12*1024 {
		t.Errorf("README.md is %d bytes, over 12 KB: put topics in docs/", fi.Size())
	}
}
