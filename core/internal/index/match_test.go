package index

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
)

// The bitmask MatchPrefix (up to 64 candidates) must answer exactly as the
// general per-record walk (used beyond 64 candidates) on random index
// states: shared prefixes, every tier, removals, speculation, expired
// speculation, candidates in any order and unknown ids.
func TestMatchMaskedAgreesWithGeneralWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	clock := time.Unix(1000, 0)
	ix := New(Config{MaxEntries: 1 << 16, SpecTTL: time.Second, Now: func() time.Time { return clock }})
	// Servers 0-5 and 64-69 hold blocks: candidate sets without the
	// latter use the key summaries (fast), sets with them do not.
	const nsrv, bs = 12, 4
	var srv []ServerID
	for i := 0; i < 70; i++ {
		id, _ := ix.AddServer(fmt.Sprint("s", i), ServerOptions{})
		if i < nsrv/2 || i >= 70-nsrv/2 {
			srv = append(srv, id)
		}
	}
	base := make([]int32, 64*bs)
	for i := range base {
		base[i] = int32(rng.IntN(1000))
	}
	variant := func() []int32 {
		p := append([]int32(nil), base...)
		cut := rng.IntN(len(p))
		for i := cut; i < len(p); i++ {
			p[i] = int32(rng.IntN(1000))
		}
		return p
	}
	eng := uint64(1)
	for round := 0; round < 300; round++ {
		s := srv[rng.IntN(nsrv)]
		p := variant()
		keys := blockhash.Keys(p, bs, 0)
		switch rng.IntN(4) {
		case 0, 1:
			hashes := make([]uint64, len(keys))
			for i := range hashes {
				hashes[i] = eng
				eng++
			}
			n := 1 + rng.IntN(len(keys))
			if err := ix.Stored(s, Tier(rng.IntN(NumTiers)), false, 0, hashes[:n], p[:n*bs], bs, 0); err != nil {
				t.Fatal(err)
			}
			if rng.IntN(3) == 0 {
				_ = ix.Removed(s, GPU, hashes[:rng.IntN(n+1)])
			}
		case 2:
			ix.Speculate(s, keys[:rng.IntN(len(keys)+1)])
		case 3:
			clock = clock.Add(time.Duration(rng.IntN(800)) * time.Millisecond)
		}
		if err := ix.checkSummaries(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		q := blockhash.Keys(variant(), bs, 0)
		ids := append([]ServerID(nil), srv...)
		rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		ids = append(ids[:1+rng.IntN(len(ids))], ServerID(999))
		if rng.IntN(4) == 0 {
			ids = append(ids, ids[rng.IntN(len(ids))]) // a repeated candidate
		}
		fast := make([]Match, len(ids))
		ix.MatchPrefix(q, ids, fast, nil)

		// Padding with unknown ids past 64 forces the general walk.
		long := append(append([]ServerID(nil), ids...), make([]ServerID, 70)...)
		for i := len(ids); i < len(long); i++ {
			long[i] = ServerID(5000 + i)
		}
		slow := make([]Match, len(long))
		ix.MatchPrefix(q, long, slow, nil)
		for i := range ids {
			if fast[i] != slow[i] {
				t.Fatalf("round %d candidate %d (server %d): masked %+v, general %+v", round, i, ids[i], fast[i], slow[i])
			}
		}
	}
}
