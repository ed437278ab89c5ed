package index

import (
	"math/rand/v2"
	"testing"
)

// The table must behave exactly like a Go map under random puts, gets and
// deletes, including key 0, sequential keys (engine hashes 1, 2, 3...) and
// deletions that exercise the backward shift across wrap-around.
func TestU64MapMatchesGoMap(t *testing.T) {
	for _, keyspace := range []uint64{64, 5000, 1 << 62} {
		rng := rand.New(rand.NewPCG(keyspace, 9))
		var m u64map
		ref := map[uint64]uint32{}
		for op := 0; op < 200000; op++ {
			k := rng.Uint64N(keyspace)
			if keyspace == 5000 {
				k = k<<8 | 1 // clustered low bits
			}
			switch rng.IntN(3) {
			case 0:
				v := rng.Uint32()
				m.Put(k, v)
				ref[k] = v
			case 1:
				m.Delete(k)
				delete(ref, k)
			case 2:
				v, ok := m.Get(k)
				rv, rok := ref[k]
				if ok != rok || v != rv {
					t.Fatalf("keyspace %d op %d: Get(%d) = %d,%v want %d,%v", keyspace, op, k, v, ok, rv, rok)
				}
			}
			if m.Len() != len(ref) {
				t.Fatalf("keyspace %d op %d: Len %d want %d", keyspace, op, m.Len(), len(ref))
			}
		}
		for k, rv := range ref {
			if v, ok := m.Get(k); !ok || v != rv {
				t.Fatalf("keyspace %d: final Get(%d) = %d,%v want %d", keyspace, k, v, ok, rv)
			}
		}
		if m.Len() > 0 && m.Bytes() < int64(m.Len())*u64slotBytes {
			t.Fatalf("Bytes %d below %d keys", m.Bytes(), m.Len())
		}
	}
}
