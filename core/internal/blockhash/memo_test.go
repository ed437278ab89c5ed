package blockhash

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// Through a Memo, keys are exactly AppendKeys' keys, whatever the memo
// holds: identical prompts, siblings with a shared prefix, next turns
// (extensions), prefixes of remembered prompts, other block sizes and
// namespaces, and a stream long enough to evict.
func TestMemoKeysMatchAppendKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	rnd := func(n int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(rng.IntN(50000))
		}
		return p
	}
	var m Memo
	bases := [][]int32{rnd(4096), rnd(1000), rnd(300)}
	check := func(p []int32, bs int, ns uint64) {
		t.Helper()
		want := AppendKeys(nil, p, bs, ns)
		got := m.AppendKeys([]uint64{7}, p, bs, ns) // non-empty dst
		if got[0] != 7 || !slices.Equal(got[1:], want) {
			t.Fatalf("len %d bs %d ns %d: memo keys differ from AppendKeys", len(p), bs, ns)
		}
	}
	for i := 0; i < 3000; i++ {
		base := bases[rng.IntN(len(bases))]
		var p []int32
		switch rng.IntN(5) {
		case 0: // identical
			p = base
		case 1: // sibling: shared prefix, new tail
			cut := rng.IntN(len(base) + 1)
			p = append(append([]int32(nil), base[:cut]...), rnd(rng.IntN(500))...)
		case 2: // next turn
			p = append(append([]int32(nil), base...), rnd(1+rng.IntN(300))...)
			if rng.IntN(4) == 0 {
				bases[0] = p
			}
		case 3: // prefix
			p = base[:rng.IntN(len(base)+1)]
		case 4: // unrelated
			p = rnd(rng.IntN(2000))
		}
		bs := []int{16, 16, 16, 32, 7}[rng.IntN(5)]
		ns := uint64(rng.IntN(2))
		check(p, bs, ns)
		if m.tokens > MemoMaxTokens || len(m.entries) > MemoMaxEntries {
			t.Fatalf("memo over its bounds: %d tokens, %d entries", m.tokens, len(m.entries))
		}
		sum := 0
		for _, e := range m.entries {
			sum += len(e.tokens)
			if len(e.keys)*e.bs != len(e.tokens) {
				t.Fatalf("entry with %d keys for %d tokens at bs %d", len(e.keys), len(e.tokens), e.bs)
			}
		}
		if sum != m.tokens {
			t.Fatalf("token count %d, entries hold %d", m.tokens, sum)
		}
	}
}

func BenchmarkMemoAppendKeys8kRepeat(b *testing.B) {
	p := make([]int32, 8192)
	for i := range p {
		p[i] = int32(i * 31)
	}
	var m Memo
	dst := make([]uint64, 0, 512)
	for b.Loop() {
		dst = m.AppendKeys(dst[:0], p, 16, 1)
	}
}

// appendTokens (streamed stores for long runs) is append.
func TestAppendTokensIsAppend(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for trial := 0; trial < 300; trial++ {
		src := make([]int32, rng.IntN(5000))
		for i := range src {
			src[i] = int32(rng.Uint32())
		}
		dst := make([]int32, rng.IntN(40), 40+rng.IntN(6000))
		for i := range dst {
			dst[i] = int32(rng.Uint32())
		}
		want := append(append([]int32(nil), dst...), src...)
		if got := appendTokens(dst, src); !slices.Equal(got, want) {
			t.Fatalf("trial %d: %d onto %d tokens differs from append", trial, len(src), len(dst))
		}
	}
}

// Reused counts the leading keys taken from a remembered prompt.
func TestMemoReused(t *testing.T) {
	p := make([]int32, 160) // 10 blocks of 16
	for i := range p {
		p[i] = int32(i)
	}
	sib := append(append([]int32(nil), p[:96]...), make([]int32, 64)...) // shares 6 blocks
	var m Memo
	for _, tc := range []struct {
		name   string
		tokens []int32
		want   int
	}{
		{"cold", p, 0},
		{"repeat", p, 10},
		{"sibling", sib, 6},
		{"unrelated", make([]int32, 40), 0},
		{"under a block", p[:10], 0},
	} {
		m.AppendKeys(nil, tc.tokens, 16, 3)
		if got := m.Reused(); got != tc.want {
			t.Fatalf("%s: Reused %d, want %d", tc.name, got, tc.want)
		}
	}
}
