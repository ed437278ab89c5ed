package kvevents

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

var updateCorpus = flag.Bool("update-corpus", false, "rewrite testdata/fuzz/FuzzDecode seed files")

// checkAllocBound asserts that nothing in b is larger than the input could
// justify: every slice DecodeInto allocates is sized from a declared length
// that was checked against the remaining bytes.
func checkAllocBound(t *testing.T, data []byte, b *Batch) {
	t.Helper()
	n := len(data)
	if cap(b.Events) > n {
		t.Fatalf("events cap %d for a %d-byte input", cap(b.Events), n)
	}
	for i := range b.Events[:cap(b.Events)] {
		e := &b.Events[:cap(b.Events)][i]
		if cap(e.BlockHashes) > n || cap(e.TokenIDs) > n || cap(e.ExtraKeys) > n || len(e.TypeName) > n || len(e.LoraName) > n {
			t.Fatalf("event %d: caps %d/%d/%d for a %d-byte input", i, cap(e.BlockHashes), cap(e.TokenIDs), cap(e.ExtraKeys), n)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range seedCorpus() {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var b Batch
		err := DecodeInto(data, &b)
		checkAllocBound(t, data, &b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		for i := range b.Events {
			if b.Events[i].Kind == KindUnknown {
				return // not encodable
			}
		}
		for _, layout := range []Layout{LayoutArray, LayoutMap} {
			p, err := Encode(&b, layout)
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			again, err := Decode(p)
			if err != nil {
				t.Fatalf("decode of re-encoded batch: %v", err)
			}
			if d := diffBatch(&b, again); d != "" {
				t.Fatalf("layout %d round trip: %s", layout, d)
			}
		}
	})
}

type seed struct {
	name string
	data []byte
}

func seedCorpus() []seed {
	ts := f64(goldenTS)
	r := rand.New(rand.NewPCG(9, 9))
	var seeds []seed
	add := func(name string, data []byte) { seeds = append(seeds, seed{name, data}) }
	add("golden_a_positional", mustHex(goldenA))
	add("golden_b_map", mustHex(goldenB))
	for i := range 3 {
		// Small batches fuzz faster; keep each seed under 1 KiB.
		var pa, pm []byte
		for len(pa) == 0 || len(pm) > 1024 {
			b := randomBatch(r)
			if len(b.Events) == 0 {
				continue
			}
			pa, _ = Encode(b, LayoutArray)
			pm, _ = Encode(b, LayoutMap)
		}
		add(fmt.Sprintf("random_%d_positional", i), pa)
		add(fmt.Sprintf("random_%d_map", i), pm)
	}
	add("map_batch", mp(str("ts"), ts, str("events"), arr(arr(str("AllBlocksCleared"))), str("data_parallel_rank"), nilv))
	add("batch_2_removed_old", arr(ts, arr(arr(str("BlockRemoved"), uints(5, 6)))))
	add("map_type_last_unknown_key", arr(ts, arr(mp(str("block_hashes"), arr(bin([]byte{1, 2, 3})), str("x"), arr(mp()), str("type"), str("BlockStored"))), u(0)))
	add("unknown_type", arr(ts, arr(arr(str("BlockMoved"), u(1)), mp(str("type"), str("Other"))), u(1)))
	add("lmcache_negative", arr(ts, arr(posStored(arr(i64(-5), i64(-1)), u(0), ints(seq(0, 20)...), u(16), nilv, str("cpu"))), u(0)))
	add("broken_truncated", mustHex(goldenB)[:100])
	add("broken_trailing", append(mustHex(goldenA), 0xc0))
	add("broken_huge_array", mustHex("dd ffffffff"))
	add("broken_token_overflow", arr(ts, arr(posStored(uints(1), nilv, arr(mustHex("ce80000000")), u(1)))))
	add("broken_len_mismatch", arr(ts, arr(posStored(uints(1), nilv, ints(seq(0, 17)...), u(16)))))
	return seeds
}

// TestWriteFuzzCorpus regenerates testdata/fuzz/FuzzDecode with
// `go test -run TestWriteFuzzCorpus -update-corpus`; otherwise it checks
// that the seed files exist.
func TestWriteFuzzCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	for _, s := range seedCorpus() {
		path := filepath.Join(dir, "seed_"+s.name)
		if !*updateCorpus {
			if _, err := os.Stat(path); err != nil {
				t.Errorf("missing seed file %s (run with -update-corpus)", path)
			}
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		content := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s.data)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHostileAllocation decodes small hostile inputs that declare huge
// lengths and checks that total allocation stays small.
func TestHostileAllocation(t *testing.T) {
	ts := f64(1)
	hostile := [][]byte{
		mustHex("dd ffffffff"),
		mustHex("df ffffffff"),
		arr(ts, mustHex("dd 0001ffff 91")),
		arr(ts, arr(posStored(mustHex("dd 000fffff cf")))),
		arr(ts, arr(posStored(uints(1), nilv, mustHex("dd 003fffff 01 02")))),
		arr(ts, arr(arr(mustHex("db 7fffffff 41")))),
		arr(ts, arr(), u(0), mustHex("dd 7fffffff 91 91 91")),
		arr(ts, arr(posStored(arr(mustHex("c6 7fffffff 00"))))),
	}
	var b Batch
	for _, p := range hostile {
		if err := DecodeInto(p, &b); err == nil {
			t.Fatalf("accepted %x", p)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		const runs = 50
		for range runs {
			_, _ = Decode(p)
		}
		runtime.ReadMemStats(&after)
		if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 4096 {
			t.Errorf("decoding %x allocates %d bytes per call", p, per)
		}
	}
}

// TestDecodeIntoSteadyStateAllocs: a reused Batch decodes known-medium
// payloads with no allocation.
func TestDecodeIntoSteadyStateAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip()
	}
	for _, layout := range []Layout{LayoutArray, LayoutMap} {
		p, _ := Encode(benchBatch(16, 8, true), layout)
		var b Batch
		if err := DecodeInto(p, &b); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(50, func() {
			if err := DecodeInto(p, &b); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("layout %d: %v allocs per DecodeInto, want 0", layout, allocs)
		}
	}
}
