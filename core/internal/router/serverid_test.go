package router

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckServerID(t *testing.T) {
	cases := []struct {
		id   string
		want string // "" = valid
	}{
		{"10.0.0.1:8000", ""},
		{"ünïcode-服务器", ""},
		{"\uFFFD literal replacement character", ""},
		{strings.Repeat("x", MaxServerIDBytes), ""},
		{"", "empty"},
		{strings.Repeat("x", MaxServerIDBytes+1), "65537 bytes, more than the limit of 65536"},
		{"ab\xffcd", "not valid UTF-8 (first bad byte at offset 2)"},
		{"\xed\xa0\x80", "not valid UTF-8 (first bad byte at offset 0)"}, // a UTF-8-encoded surrogate
		{"a\x00b", "contains a NUL byte at offset 1"},
	}
	for _, c := range cases {
		err := CheckServerID(c.id)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q: %v", c.id, err)
		case c.want != "" && (!errors.Is(err, ErrBadServerID) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%.20q: got %v, want %q", c.id, err, c.want)
		}
	}
	r, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.AddServers([]string{"ok", "a\x00b"}); !errors.Is(err, ErrBadServerID) || len(r.Servers()) != 0 {
		t.Fatalf("AddServers with a NUL id: %v, pool %v", err, r.Servers())
	}
}
