package kvcrouter

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	json "github.com/goccy/go-json"
)

// TestConfigDocIsCurrent: docs/configuration.md is what the generator
// makes from the current model. On failure run `make docs`.
func TestConfigDocIsCurrent(t *testing.T) {
	root := filepath.Join("..", "..")
	got, err := ConfigReference(root)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(root, "docs", "configuration.md"))
	if err != nil {
		t.Fatalf("%v (generate it with `make docs`)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("docs/configuration.md is stale: run `make docs` (go run ./cmd/kvctl config-doc > docs/configuration.md)")
	}
}

// TestEveryKeyDocumented: every key of the effective configuration (both
// modes) has a row, and every row but the notes has a description.
func TestEveryKeyDocumented(t *testing.T) {
	doc, err := ConfigReference(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"default", "kvc_aware"} {
		c, err := Defaults(mode)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(c)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		var walk func(prefix string, v any)
		walk = func(prefix string, v any) {
			if mm, ok := v.(map[string]any); ok && prefix != "router.strategies" {
				for k, sub := range mm {
					p := k
					if prefix != "" {
						p = prefix + "." + k
					}
					walk(p, sub)
				}
				return
			}
			if !bytes.Contains(doc, []byte("| `"+prefix+"` |")) {
				t.Errorf("%s: no row for %s", mode, prefix)
			}
		}
		walk("", m)
	}
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "| `") && strings.Count(line, "|") >= 4 && strings.HasSuffix(line, "|  |") {
			t.Errorf("row without a description: %s", line)
		}
	}
}
