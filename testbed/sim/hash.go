package sim

import (
	"encoding/binary"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// rootHash is the parent of block 0 in the internal chain.
const rootHash uint64 = 0x9e3779b97f4a7c15

// Mix64 is the splitmix64 finaliser: a bijection on uint64.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// sampleKey derives the per-request output stream from the engine seed, the
// request's sampling seed and the prompt.
func sampleKey(seed, sampling uint64, prompt []int32) uint64 {
	d := xxhash.New()
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	binary.LittleEndian.PutUint64(b[8:], sampling)
	_, _ = d.Write(b[:])
	var t [4]byte
	for _, x := range prompt {
		binary.LittleEndian.PutUint32(t[:], uint32(x))
		_, _ = d.Write(t[:])
	}
	return d.Sum64()
}

// sampleToken is output token idx of a request: deterministic in its key.
func sampleToken(key uint64, idx, vocab int) int32 {
	return int32(Mix64(key+uint64(idx+1)*0x9e3779b97f4a7c15) % uint64(vocab))
}

// Tokenize is the simulator's trivial tokeniser: the text is split on
// Unicode whitespace and each word maps to xxhash64(word) mod vocab.
// Equal texts give equal ids, and texts sharing leading words share a
// token prefix.
func Tokenize(text string, vocab int) []int32 {
	if vocab <= 0 {
		vocab = DefaultVocabSize
	}
	words := strings.Fields(text)
	out := make([]int32, len(words))
	for i, w := range words {
		out[i] = int32(xxhash.Sum64String(w) % uint64(vocab))
	}
	return out
}

// Detokenize renders token ids as text: " t<id>" per token, so output text
// re-tokenises to a stable sequence.
func Detokenize(ids []int32) string {
	var sb strings.Builder
	sb.Grow(len(ids) * 7)
	var buf [12]byte
	for _, id := range ids {
		sb.WriteString(" t")
		sb.Write(appendInt(buf[:0], int64(id)))
	}
	return sb.String()
}

func appendInt(b []byte, v int64) []byte {
	if v == 0 {
		return append(b, '0')
	}
	if v < 0 {
		b = append(b, '-')
		v = -v
	}
	var tmp [20]byte
	i := len(tmp)
	for v > 0 {
		i--
		tmp[i] = byte('0' + v%10)
		v /= 10
	}
	return append(b, tmp[i:]...)
}
