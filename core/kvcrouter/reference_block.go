package kvcrouter

// The reference's first part: the router block as users write it, one row
// per key with its default, meaning and when to change it, generated from
// the types that define the shape (user.go) and the library's sections its
// keys go to.

import (
	"fmt"
	"reflect"
	"strings"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/internal/collector"
	"github.com/kvc-router/kvc-router/core/internal/router"
	"github.com/kvc-router/kvc-router/core/internal/strategy"
)

// whenMarker separates a field comment's meaning from its advice.
const whenMarker = "When to change:"

// splitDoc cuts a field comment into its meaning and its "When to change"
// advice.
func splitDoc(doc string) (meaning, when string) {
	meaning, when, _ = strings.Cut(doc, whenMarker)
	return strings.TrimSpace(meaning), strings.TrimSpace(when)
}

// blockRow is one row of the router block's table.
type blockRow struct {
	key, typ, def, meaning, when string
}

// blockDefaults are the effective documents of a type given alone.
func blockDefaults() (map[string]map[string]any, error) {
	out := map[string]map[string]any{}
	for _, mode := range []string{router.ModeDefault, router.ModeKVCAware} {
		c, err := Parse([]byte(`{"router_config": {"type": "` + mode + `"}}`))
		if err != nil {
			return nil, err
		}
		if c, err = c.Effective(); err != nil {
			return nil, err
		}
		var m map[string]any
		b, _ := json.Marshal(c)
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		out[mode] = m
	}
	return out, nil
}

// BlockReferenceKeys lists the key of every row of the router block's
// table (for tests).
func BlockReferenceKeys(root string) ([]string, error) {
	g := &gen{root: root, docs: map[string]string{}}
	rows, err := g.blockRows()
	keys := make([]string, len(rows))
	for i, r := range rows {
		keys[i] = r.key
	}
	return keys, err
}

// blockRows builds the router block's rows: router.type and router.config,
// then router.config's keys by where they go.
func (g *gen) blockRows() ([]blockRow, error) {
	defs, err := blockDefaults()
	if err != nil {
		return nil, err
	}
	def := func(lib string) string {
		if lib == "" {
			return "—"
		}
		d0, ok0 := refLookup(defs[router.ModeDefault], lib)
		d1, ok1 := refLookup(defs[router.ModeKVCAware], lib)
		s := show(d0, ok0)
		if s1 := show(d1, ok1); s1 != s {
			s += " (kvc_aware: " + s1 + ")"
		}
		return s
	}
	var rows []blockRow
	add := func(t reflect.Type, field, key, lib string) error {
		f, _ := t.FieldByName(field)
		doc, err := g.fieldDoc(t, field)
		if err != nil {
			return err
		}
		meaning, when := splitDoc(doc)
		d := def(lib)
		if k := f.Type.Kind(); k == reflect.Struct || k == reflect.Map || k == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct {
			d = "see its keys"
		}
		rows = append(rows, blockRow{key: key, typ: typeName(f.Type), def: d, meaning: meaning, when: when})
		return nil
	}
	// walk adds a row per field of t (and of its nested objects), the user
	// key under at and the library key under lib ("" = no default to show,
	// "." = the document's root).
	var walk func(t reflect.Type, at, lib string, skip ...string) error
	walk = func(t reflect.Type, at, lib string, skip ...string) error {
		for i := range t.NumField() {
			f := t.Field(i)
			name := jsonName(f)
			if name == "" || name == "-" || !f.IsExported() || contains(skip, name) {
				continue
			}
			key, l := at+"."+name, ""
			switch lib {
			case "":
			case ".": // the document's root
				l = name
			default:
				l = lib + "." + name
			}
			if err := add(t, f.Name, key, l); err != nil {
				return err
			}
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch {
			case ft.Kind() == reflect.Struct:
				if err := walk(ft, key, l); err != nil {
					return err
				}
			case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
				if err := walk(ft.Elem(), key+".<id>", ""); err != nil {
					return err
				}
			}
		}
		return nil
	}
	bt := reflect.TypeOf(Block{})
	if err := add(bt, "Type", "router.type", "router.mode"); err != nil {
		return nil, err
	}
	if err := add(bt, "Config", "router.config", ""); err != nil {
		return nil, err
	}
	const at = "router.config"
	// Strategies: the entry's own keys, then each strategy's parameters.
	ct := reflect.TypeOf(BlockConfig{})
	if err := add(ct, "Strategies", at+".strategies", ""); err != nil {
		return nil, err
	}
	st := reflect.TypeOf(BlockStrategy{})
	for i := range st.NumField() {
		f := st.Field(i)
		if err := add(st, f.Name, at+".strategies[i]."+jsonName(f), ""); err != nil {
			return nil, err
		}
		if jsonName(f) == "weight" {
			rows[len(rows)-1].def = show(defaultWeight, true)
		}
	}
	for _, name := range strategy.Names() {
		s, err := strategy.Build(name, nil)
		if err != nil {
			return nil, err
		}
		var params map[string]any // the strategy's own defaults
		b, _ := json.Marshal(s)
		_ = json.Unmarshal(b, &params)
		pt := reflect.TypeOf(s)
		for pt.Kind() == reflect.Pointer {
			pt = pt.Elem()
		}
		for i := range pt.NumField() {
			f := pt.Field(i)
			if jsonName(f) == "" || !f.IsExported() {
				continue
			}
			if err := add(pt, f.Name, at+".strategies[i]."+jsonName(f), ""); err != nil {
				return nil, err
			}
			r := &rows[len(rows)-1]
			r.meaning = "(" + name + ") " + r.meaning
			r.def = show(refLookup(params, jsonName(f)))
		}
	}
	// Collector: its own keys, the keys the balancer reads, then every
	// library collector key.
	if err := add(ct, "Collector", at+".collector", ""); err != nil {
		return nil, err
	}
	if err := walk(reflect.TypeOf(BlockCollector{}), at+".collector", ""); err != nil {
		return nil, err
	}
	rows[len(rows)-1].def = def("router.load.unhealthy_after")
	if err := walk(reflect.TypeOf(HandleEndpoints{}), at+".collector", "integration.collector"); err != nil {
		return nil, err
	}
	first := len(rows)
	if err := walk(reflect.TypeOf(collector.Spec{}), at+".collector", "", "name", "endpoints"); err != nil {
		return nil, err
	}
	for i := first; i < len(rows); i++ {
		if rows[i].def == "—" {
			rows[i].def = "per collector (see Collectors)"
		}
	}
	// The library's router section, its top level, and the integration keys.
	if err := walk(reflect.TypeOf(router.Config{}), at, "router", "mode", "strategies"); err != nil {
		return nil, err
	}
	if err := walk(reflect.TypeOf(Config{}), at, ".", "router", "collectors", "integration"); err != nil {
		return nil, err
	}
	if err := walk(reflect.TypeOf(Integration{}), at, "integration", "collector"); err != nil {
		return nil, err
	}
	// The balancer's document resolves admission.enabled's "auto" by the
	// class (translator.admission), so the library's boolean default is
	// not the block's.
	for i := range rows {
		if rows[i].key == at+".admission.enabled" {
			rows[i].typ = `boolean or "auto"`
			rows[i].def = `"auto" (on in the async balancer unless turns is multi; off in the synchronous one)`
		}
	}
	return rows, nil
}

// block writes the router block's section.
func (g *gen) block() error {
	rows, err := g.blockRows()
	if err != nil {
		return err
	}
	g.b.WriteString("## The router block\n\n" +
		"Every key a user can write under `actor_rollout_ref.rollout.router` (or pass as `router_config`). " +
		"Defaults are for `type: default` and, where they differ, `type: kvc_aware` given without a `config` " +
		"(the packaged defaults); \"—\" means unset, with the behaviour the meaning gives.\n\n" +
		"| key | type | default | meaning | when to change |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(g.b, "| `%s` | %s | %s | %s | %s |\n", r.key, r.typ, r.def, escape(r.meaning), escape(r.when))
	}
	g.b.WriteString("\n")
	return nil
}
