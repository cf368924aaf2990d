package ratelimit

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestRootImports: the root package is the Caddy module around package
// limiter, its one way in: of this module it imports limiter,
// limiter/bucket and limiter/overrides (the types it names), clientkey
// and internal packages, and never the Redis client, which limiter dials
// from plain options. Test files are held to the Redis client rule too
// (they reach a test Redis through internal/redistest).
func TestRootImports(t *testing.T) {
	const module = "github.com/caddy-ratelimit/caddy-rate-limit"
	allowed := map[string]bool{module + "/limiter": true, module + "/limiter/bucket": true,
		module + "/limiter/overrides": true, module + "/clientkey": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			switch {
			case strings.HasPrefix(path, "github.com/redis/go-redis"):
				t.Errorf("%s imports %s: the root reaches Redis through limiter.New", name, path)
			case strings.HasSuffix(name, "_test.go"), !strings.HasPrefix(path, module+"/"):
			case !allowed[path] && !strings.HasPrefix(path, module+"/internal/"):
				t.Errorf("%s imports %s: the root reaches the stores through package limiter", name, path)
			}
		}
	}
}
