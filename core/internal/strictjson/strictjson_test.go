package strictjson

import (
	"errors"
	"strings"
	"testing"

	json "github.com/goccy/go-json"
)

type inner struct {
	A int                `json:"a"`
	W map[string]float64 `json:"w"`
}

type doc struct {
	X   int              `json:"x"`
	In  inner            `json:"in"`
	L   []inner          `json:"l"`
	M   map[string]inner `json:"m"`
	Raw json.RawMessage  `json:"raw"`
	F   *bool            `json:"f,omitempty"`
}

func TestDecodeNamesTheKey(t *testing.T) {
	for _, tc := range []struct {
		in, key, msg string
	}{
		{`{"x":"s"}`, "x", "must be an integer"},
		{`{"x":1.5}`, "x", "must be an integer"},
		{`{"y":1}`, "y", "unknown key (allowed here: f, in, l, m, raw, x)"},
		{`{"in":{"b":1}}`, "in.b", "unknown key"},
		{`{"l":[{},{"a":true}]}`, "l[1].a", "must be an integer"},
		{`{"l":[{},{"zz":1}]}`, "l[1].zz", "unknown key"},
		{`{"m":{"k":{"q":1}}}`, `m["k"].q`, "unknown key"},
		{`{"in":{"w":{"g":"x"}}}`, `in.w["g"]`, "must be a number"},
		{`{"m":{"a:1":{"a":"x"}}}`, `m["a:1"].a`, "must be an integer"},
		{`{"f":3}`, "f", "must be true or false"},
		{`{"x":1} {}`, "", "trailing data"},
		{`{"x":`, "", "invalid JSON"},
	} {
		var d doc
		err := Decode([]byte(tc.in), &d)
		var ke *KeyError
		if !errors.As(err, &ke) {
			t.Fatalf("%s: error %v is not a *KeyError", tc.in, err)
		}
		if ke.Key != tc.key || !contains(ke.Msg, tc.msg) {
			t.Errorf("%s: got key %q msg %q, want key %q msg containing %q", tc.in, ke.Key, ke.Msg, tc.key, tc.msg)
		}
	}
	var d doc
	if err := Decode([]byte(`{"x":2,"raw":{"anything":[1]},"m":{"k":{"a":1}}}`), &d); err != nil || d.X != 2 || d.M["k"].A != 1 {
		t.Fatalf("valid document: %v %+v", err, d)
	}
}

func TestPrefixed(t *testing.T) {
	err := Prefixed("router", Errorf("strategies[0].weight", "must be > 0"))
	if err.Error() != "router.strategies[0].weight: must be > 0" {
		t.Fatal(err)
	}
	if Join("a", "[1]") != "a[1]" || Join("", "b") != "b" || Join("a", "") != "a" {
		t.Fatal("Join")
	}
	plain := errors.New("x")
	if Prefixed("p", plain) != plain {
		t.Fatal("non-key errors pass through")
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
