package kvcrouter

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/internal/strategy"
)

// blockTable reads the router block's rows back from the generated
// reference: key -> [type, default, meaning, when to change].
func blockTable(t *testing.T) map[string][]string {
	t.Helper()
	doc, err := ConfigReference(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "## The router block")
	end := strings.Index(text, "## The library's document")
	if start < 0 || end < start {
		t.Fatal("no router block section")
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(text[start:end], "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(strings.ReplaceAll(line, `\|`, "\x00"), "|"), "|")
		if len(cells) != 5 {
			t.Fatalf("row with %d cells: %s", len(cells), line)
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(strings.ReplaceAll(cells[i], "\x00", "|"))
		}
		rows[strings.Trim(cells[0], "`")] = cells[1:]
	}
	return rows
}

// TestBlockReferenceCoversEveryKey: every key the library accepts under
// router.config (derived from the schema's types and the strategy
// registry, not listed) has a row with a meaning and advice on when to
// change it, and so does every key of the effective configuration.
func TestBlockReferenceCoversEveryKey(t *testing.T) {
	rows := blockTable(t)
	want := []string{"router.type", "router.config"}
	own, routerKeys, top, integ := BlockConfigKeys()
	for _, k := range slices.Concat(own, routerKeys, top, integ) {
		want = append(want, "router.config."+k)
	}
	cown, spec, cinteg := CollectorKeys()
	for _, k := range slices.Concat(cown, spec, cinteg) {
		want = append(want, "router.config.collector."+k)
	}
	for _, k := range jsonKeys(reflect.TypeOf(BlockStrategy{})) {
		want = append(want, "router.config.strategies[i]."+k)
	}
	for _, name := range strategy.Names() {
		s, err := strategy.Build(name, nil)
		if err != nil {
			t.Fatal(err)
		}
		var params map[string]any
		b, _ := json.Marshal(s)
		_ = json.Unmarshal(b, &params)
		for k := range params {
			want = append(want, "router.config.strategies[i]."+k)
		}
	}
	// Every leaf of the effective configuration, at the key users write.
	for _, mode := range []string{"default", "kvc_aware"} {
		c, err := Parse([]byte(`{"router_config": {"type": "` + mode + `"}}`))
		if err == nil {
			c, err = c.Effective()
		}
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		b, _ := json.Marshal(c)
		_ = json.Unmarshal(b, &m)
		var walk func(prefix string, v any)
		walk = func(prefix string, v any) {
			if mm, ok := v.(map[string]any); ok && len(mm) > 0 {
				for k, sub := range mm {
					walk(strings.TrimPrefix(prefix+"."+k, "."), sub)
				}
				return
			}
			switch {
			case prefix == "router.mode":
				want = append(want, "router.type")
			case strings.HasPrefix(prefix, "router.strategies"), strings.HasPrefix(prefix, "collectors"):
				// Rows per strategy parameter and collector key, above.
			case strings.HasPrefix(prefix, "integration.collector."):
				want = append(want, "router.config.collector."+strings.TrimPrefix(prefix, "integration.collector."))
			case strings.HasPrefix(prefix, "integration."):
				want = append(want, "router.config."+strings.TrimPrefix(prefix, "integration."))
			case strings.HasPrefix(prefix, "router."):
				want = append(want, "router.config."+strings.TrimPrefix(prefix, "router."))
			default:
				want = append(want, "router.config."+prefix)
			}
		}
		walk("", m)
	}
	for _, k := range want {
		r, ok := rows[k]
		if !ok {
			t.Errorf("no row for %s", k)
			continue
		}
		if r[2] == "" || r[3] == "" {
			t.Errorf("%s: meaning %q, when to change %q: both are needed", k, r[2], r[3])
		}
	}
	for k, r := range rows {
		if r[2] == "" || r[3] == "" {
			t.Errorf("%s: meaning %q, when to change %q: both are needed", k, r[2], r[3])
		}
	}
}

// TestBlockReferenceDefaultsAreAccepted: each row's documented default,
// written at its key, is a configuration the library accepts, and the
// library reports that value back (the table and the schema agree).
func TestBlockReferenceDefaultsAreAccepted(t *testing.T) {
	rows := blockTable(t)
	n := 0
	for key, r := range rows {
		def := r[1]
		if !strings.HasPrefix(def, "`") || !strings.HasPrefix(key, "router.config.") {
			continue
		}
		if i := strings.Index(def, "(kvc_aware: `"); i >= 0 {
			def = def[i+len("(kvc_aware: "):] // these configurations are kvc_aware
		}
		raw := json.RawMessage(strings.SplitN(def[1:], "`", 2)[0])
		path := strings.Split(strings.TrimPrefix(key, "router.config."), ".")
		var v any = raw
		for i := len(path) - 1; i >= 0; i-- {
			if p, ok := strings.CutSuffix(path[i], "[i]"); ok {
				entry := v.(map[string]any)
				entry["name"] = "kvc_aware"
				v = map[string]any{p: []any{entry}}
				continue
			}
			v = map[string]any{path[i]: v}
		}
		doc, _ := json.Marshal(map[string]any{"router_config": map[string]any{"type": "kvc_aware", "config": v}})
		c, err := Parse(doc)
		if err != nil {
			t.Errorf("%s = %s: %v", key, raw, err)
			continue
		}
		n++
		eff, _ := c.Effective()
		b, _ := json.Marshal(eff)
		if !strings.Contains(string(b), strings.TrimSuffix(strings.TrimPrefix(string(raw), "{"), "}")) {
			t.Errorf("%s = %s: not in the effective configuration %s", key, raw, b)
		}
	}
	if n < 40 {
		t.Fatalf("only %d rows with a default checked", n)
	}
}
