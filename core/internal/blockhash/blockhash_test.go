package blockhash

import (
	"encoding/binary"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func seq(n int, start int32) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = start + int32(i)
	}
	return t
}

// naiveChain is an independent statement of the documented key formula.
func naiveChain(parent uint64, block []int32) uint64 {
	b := binary.LittleEndian.AppendUint64(nil, parent)
	for _, t := range block {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	return xxhash.Sum64(b)
}

func TestKeysFollowDocumentedFormula(t *testing.T) {
	for _, bs := range []int{1, 16, 64, 128, 129, 512, 1000} {
		toks := seq(3*bs+bs/2, 7)
		got := Keys(toks, bs, Namespace("m"))
		if len(got) != 3 {
			t.Fatalf("bs=%d: %d keys, want 3 (partial tail must not be keyed)", bs, len(got))
		}
		p := Root(Namespace("m"), bs)
		for i := 0; i < 3; i++ {
			p = naiveChain(p, toks[i*bs:(i+1)*bs])
			if got[i] != p {
				t.Fatalf("bs=%d key %d = %x want %x", bs, i, got[i], p)
			}
		}
	}
}

func TestKeysProperties(t *testing.T) {
	ns := Namespace("qwen", "")
	a := seq(64, 1)
	b := append(seq(32, 1), seq(32, 100)...)
	ka, kb := Keys(a, 16, ns), Keys(b, 16, ns)
	cases := []struct {
		name string
		ok   bool
	}{
		{"shared prefix blocks equal", ka[0] == kb[0] && ka[1] == kb[1]},
		{"divergent block differs", ka[2] != kb[2]},
		{"chained: same block at another position differs", Keys(seq(16, 1), 16, ns)[0] != Keys(append(seq(16, 1), seq(16, 1)...), 16, ns)[1]},
		{"namespace separates", Keys(a, 16, Namespace("other", ""))[0] != ka[0]},
		{"lora separates", Keys(a, 16, Namespace("qwen", "alice"))[0] != ka[0]},
		{"namespace parts are delimited", Namespace("ab", "") != Namespace("a", "b")},
		{"block size separates", Keys(a, 32, ns)[0] != Keys(a, 16, ns)[1]},
		{"short prompt has no key", len(Keys(seq(15, 1), 16, ns)) == 0},
		{"invalid block size has no key", len(Keys(a, 0, ns)) == 0 && len(Keys(a, -4, ns)) == 0},
		{"negative token ids hash", Keys([]int32{-1, -2}, 2, ns)[0] != Keys([]int32{1, 2}, 2, ns)[0]},
	}
	for _, c := range cases {
		if !c.ok {
			t.Errorf("%s: violated", c.name)
		}
	}
}

func TestHittableBlocks(t *testing.T) {
	cases := []struct{ n, bs, want int }{
		{0, 16, 0}, {1, 16, 0}, {16, 16, 0}, {17, 16, 1}, {32, 16, 1}, {33, 16, 2}, {8192, 16, 511}, {100, 0, 0},
	}
	for _, c := range cases {
		if got := HittableBlocks(c.n, c.bs); got != c.want {
			t.Errorf("HittableBlocks(%d,%d)=%d want %d", c.n, c.bs, got, c.want)
		}
	}
}

func TestAppendKeysAllocationFree(t *testing.T) {
	toks := seq(8192, 3)
	dst := make([]uint64, 0, 512)
	allocs := testing.AllocsPerRun(20, func() {
		dst = AppendKeys(dst[:0], toks, 16, 42)
	})
	if allocs != 0 {
		t.Fatalf("AppendKeys allocated %.1f times per run, want 0", allocs)
	}
}

func FuzzKeys(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, uint8(2), uint64(0))
	f.Add(make([]byte, 4096), uint8(16), uint64(99))
	f.Fuzz(func(t *testing.T, raw []byte, bs uint8, ns uint64) {
		toks := make([]int32, len(raw)/4)
		for i := range toks {
			toks[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		b := int(bs)
		keys := Keys(toks, b, ns)
		if len(keys) != FullBlocks(len(toks), b) {
			t.Fatalf("%d keys for %d tokens at bs %d", len(keys), len(toks), b)
		}
		// Prefix stability: keys of a prefix are a prefix of the keys.
		if len(keys) > 1 {
			short := Keys(toks[:b*(len(keys)-1)], b, ns)
			for i := range short {
				if short[i] != keys[i] {
					t.Fatalf("key %d of prefix differs", i)
				}
			}
		}
		p := Root(ns, b)
		for i, k := range keys {
			p = naiveChain(p, toks[i*b:(i+1)*b])
			if k != p {
				t.Fatalf("key %d mismatch", i)
			}
		}
	})
}

func BenchmarkAppendKeys8k(b *testing.B) {
	toks := seq(8192, 3)
	dst := make([]uint64, 0, 512)
	b.SetBytes(int64(4 * len(toks)))
	for b.Loop() {
		dst = AppendKeys(dst[:0], toks, 16, 42)
	}
}
