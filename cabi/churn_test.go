package main

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	json "github.com/goccy/go-json"
)

// Issue 20 D1, library side: acquires racing add/remove (run under -race)
// always name a server consistently: the index is valid, out_server is
// written exactly when the caller's generation is stale, and a caller that
// mirrors the pool at the returned generation finds that server at the index.
func TestAcquireDuringPoolChurn(t *testing.T) {
	h, res := abiNew([]byte(`{}`), 2, false)
	if res.Code != codeOK {
		t.Fatal(res)
	}
	defer abiClose(h)
	add := func(ids ...string) {
		b, _ := json.Marshal(ids)
		if res := abiString(h, "add", b, int64(len(b)), nil, 0, 0); res.Code != codeOK {
			t.Error(res)
		}
	}
	remove := func(ids ...string) {
		b, _ := json.Marshal(ids)
		if res := abiString(h, "remove", b, int64(len(b)), nil, 0, 0); res.Code != codeOK {
			t.Error(res)
		}
	}
	add("s0", "s1")
	// pools records the pool of every generation seen by the churner.
	var mu sync.Mutex
	pools := map[int64][]string{}
	snapshot := func() {
		var pool []string
		var gen int64
		// The generation is read separately: only trust it if stable.
		for {
			g1 := currentGen(h)
			out := abiPlain(h, "servers", false)
			if g2 := currentGen(h); g1 == g2 {
				gen = g1
				_ = json.Unmarshal([]byte(out.Out), &pool)
				break
			}
		}
		mu.Lock()
		pools[gen] = pool
		mu.Unlock()
	}
	snapshot()
	var stop atomic.Bool
	var bad atomic.Int64
	var n atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			known := int64(-1)
			for i := 0; !stop.Load(); i++ {
				idx, gen, srv, res := abiAcquireFull(h, fmt.Sprintf("w%d-%d", w, i%32), known)
				n.Add(1)
				switch {
				case res.Code != codeOK:
					bad.Add(1)
					t.Errorf("acquire: %+v", res)
					return
				case idx < 0:
					bad.Add(1)
				case gen == known && srv != "":
					bad.Add(1) // a string the caller did not need
				case gen != known && srv == "":
					bad.Add(1) // a stale caller left without the id
				}
				if srv != "" {
					mu.Lock()
					pool, ok := pools[gen]
					mu.Unlock()
					if ok && (int(idx) >= len(pool) || pool[idx] != srv) {
						bad.Add(1)
					}
				}
				if srv != "" {
					abiString(h, "release", []byte(srv), int64(len(srv)), nil, 0, 0)
				}
				known = gen
			}
		}(w)
	}
	for c := 0; c < 300; c++ {
		id := fmt.Sprintf("c%d", c%4)
		add(id)
		snapshot()
		if c%3 == 0 {
			remove(fmt.Sprintf("c%d", (c+1)%4))
			snapshot()
		}
	}
	stop.Store(true)
	wg.Wait()
	if bad.Load() != 0 || n.Load() < 100 {
		t.Fatalf("%d inconsistent answers in %d acquires", bad.Load(), n.Load())
	}
	if !strings.Contains(abiPlain(h, "servers", false).Out, "s0") {
		t.Fatal("stable server lost")
	}
}

func currentGen(h uint64) int64 {
	var st struct {
		Generation int64 `json:"generation"`
	}
	_ = json.Unmarshal([]byte(abiPlain(h, "status", false).Out), &st)
	return st.Generation
}
