package blockhash

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// Chain must be xxhash64 over the concatenated bytes for every block size
// (both sides of the 32-byte stripe threshold, odd sizes with a 4-byte
// tail), or every key in a deployed index would change.
func TestChainMatchesXXHash(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for bs := 1; bs <= 300; bs++ {
		for trial := 0; trial < 8; trial++ {
			parent := rng.Uint64()
			blk := make([]int32, bs)
			for i := range blk {
				blk[i] = int32(rng.Uint32())
			}
			buf := make([]byte, 8+4*bs)
			binary.LittleEndian.PutUint64(buf, parent)
			for i, v := range blk {
				binary.LittleEndian.PutUint32(buf[8+4*i:], uint32(v))
			}
			want := xxhash.Sum64(buf)
			if got := Chain(parent, blk); got != want {
				t.Fatalf("block size %d: Chain %x, xxhash %x", bs, got, want)
			}
			if got := chainPortable(parent, blk); got != want {
				t.Fatalf("block size %d: chainPortable %x, xxhash %x", bs, got, want)
			}
		}
	}
}

// AppendKeys and the portable (copying) path must agree.
func TestAppendKeysMatchesPortable(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	tokens := make([]int32, 4099)
	for i := range tokens {
		tokens[i] = int32(rng.Uint32())
	}
	for _, bs := range []int{1, 7, 16, 32, 129, 200} {
		got := AppendKeys(nil, tokens, bs, 42)
		parent := Root(42, bs)
		for i := range got {
			buf := make([]byte, 8+4*bs)
			binary.LittleEndian.PutUint64(buf, parent)
			for j, v := range tokens[i*bs : (i+1)*bs] {
				binary.LittleEndian.PutUint32(buf[8+4*j:], uint32(v))
			}
			parent = xxhash.Sum64(buf)
			if got[i] != parent {
				t.Fatalf("bs %d block %d: %x want %x", bs, i, got[i], parent)
			}
		}
	}
}

// ChainInto over any run of blocks, from any parent, is Chain block by
// block (the 16-token loop and the general one).
func TestChainIntoMatchesChain(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := 0; trial < 200; trial++ {
		bs := []int{16, 16, 7, 32}[rng.IntN(4)]
		n := rng.IntN(40)
		tokens := make([]int32, n*bs+rng.IntN(bs))
		for i := range tokens {
			tokens[i] = int32(rng.Uint32())
		}
		parent := rng.Uint64()
		out := make([]uint64, n)
		last := ChainInto(parent, tokens, bs, out)
		want := parent
		for i := 0; i < n; i++ {
			want = Chain(want, tokens[i*bs:(i+1)*bs])
			if out[i] != want {
				t.Fatalf("bs %d block %d of %d: %x, Chain %x", bs, i, n, out[i], want)
			}
		}
		if last != want {
			t.Fatalf("bs %d: returned %x, want %x", bs, last, want)
		}
	}
}
