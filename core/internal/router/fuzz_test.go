package router

import (
	"errors"
	"testing"
)

// FuzzRouterConfig feeds arbitrary JSON to ParseConfig and, when it is
// accepted, builds a router and routes through it: a config either fails
// with ErrConfig or yields a router that works.
func FuzzRouterConfig(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"mode":"kvc_aware"}`, `{"mode":"default","sticky_max_size":1}`,
		`{"mode":"kvc_aware","strategies":[{"name":"kvc_aware","weight":1,"params":{"alpha":0.5,"load_threshold":0.8,"layer_weights":{"gpu":1}}}]}`,
		`{"mode":"kvc_aware","strategies":[{"name":"least_inflight","weight":0.5},{"name":"kvc_aware","weight":0.5}]}`,
		`{"mode":"kvc_aware","block_size":1,"max_prompt_tokens":8,"index":{"max_entries":2},"load":{"unhealthy_after":1}}`,
		`{"servers":{"a":{"block_size":32,"capacity":4,"events":true}},"events_default":true}`,
		`{"mode":"x"}`, `{"sticky_max_size":-1}`, `{"strategies":[{"name":"os.system","weight":1}]}`,
		`{"strategies":[{"name":"kvc_aware","weight":0}]}`, `{"load_threshold":2}`, `{"index":{"max_entries":-3}}`,
		`{"mode":"kvc_aware","strategies":[{"name":"kvc_aware","weight":1,"params":{"alpha":"x"}}]}`,
		`{"block_size":1e9}`, `[]`, `null`, ``, `{"mode":"kvc_aware"} {}`, "\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("ParseConfig error does not wrap ErrConfig: %v", err)
			}
			return
		}
		// Keep the run bounded whatever the input sized.
		if cfg.StickyMaxSize > 1<<20 || cfg.Index.MaxEntries > 1<<20 {
			return
		}
		r, err := New(cfg)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("New error does not wrap ErrConfig: %v", err)
			}
			return
		}
		if _, err := r.Acquire(Request{ID: "x", Pin: -1}); !errors.Is(err, ErrNoServers) {
			t.Fatalf("empty pool: %v", err)
		}
		if err := r.AddServers([]string{"a", "b"}); err != nil {
			t.Fatal(err)
		}
		toks := make([]int32, min(64, r.Config().MaxPromptTokens))
		for i := range toks {
			toks[i] = int32(i)
		}
		for i := 0; i < 3; i++ {
			d, err := r.Acquire(Request{ID: "x", Tokens: toks, Pin: -1})
			if err != nil {
				t.Fatalf("acquire: %v", err)
			}
			if d.Server != "a" && d.Server != "b" {
				t.Fatalf("routed to %q", d.Server)
			}
			if !r.Release(d.Server) {
				t.Fatalf("release of %q refused", d.Server)
			}
		}
		if n := r.TotalInflight(); n != 0 {
			t.Fatalf("in flight after release: %d", n)
		}
		if st := r.Status(); st.Index.Entries > st.Index.MaxEntries {
			t.Fatalf("index over budget: %+v", st.Index)
		}
	})
}
