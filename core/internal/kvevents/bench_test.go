package kvevents

import (
	"math/rand/v2"
	"testing"
)

// benchBatch is a realistic step: `events` BlockStored runs of `blocks`
// blocks each (block_size 16, Qwen-sized vocabulary, uint64 hashes), plus
// one BlockRemoved per stored block's worth of eviction. modern adds the
// 0.26 fields (extra_keys, group_idx, kv_cache_spec_kind).
func benchBatch(events, blocks int, modern bool) *Batch {
	r := rand.New(rand.NewPCG(5, 6))
	b := &Batch{TS: 1789095808.8378847, DPRank: 0}
	for range events {
		e := stored(nil, nil, 16)
		e.Medium = "GPU"
		e.HasParent, e.ParentBlockHash = true, r.Uint64()
		for range blocks {
			e.BlockHashes = append(e.BlockHashes, r.Uint64())
		}
		for range blocks * 16 {
			e.TokenIDs = append(e.TokenIDs, int32(r.IntN(151936)))
		}
		if modern {
			e.ExtraKeys, e.GroupIdx, e.KVCacheSpecKind = NoneExtraKeys(blocks), 0, "full_attention"
		}
		b.Events = append(b.Events, e)
		b.Events = append(b.Events, Event{Kind: KindRemoved, TypeName: "BlockRemoved",
			BlockHashes: []uint64{r.Uint64()}, Medium: "GPU", LoraID: -1, GroupIdx: -1})
	}
	return b
}

func BenchmarkDecodeInto(b *testing.B) {
	for _, bc := range []struct {
		name   string
		layout Layout
		modern bool
	}{{"positional", LayoutArray, false}, {"map", LayoutMap, true}} {
		const events, blocks = 32, 16
		p, err := Encode(benchBatch(events, blocks, bc.modern), bc.layout)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			var batch Batch
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				if err := DecodeInto(p, &batch); err != nil {
					b.Fatal(err)
				}
			}
			// Stored blocks plus one removed block per event.
			blocksPerOp := float64(events*blocks + events)
			b.ReportMetric(blocksPerOp*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

func BenchmarkDecodeFresh(b *testing.B) {
	p, _ := Encode(benchBatch(32, 16, true), LayoutMap)
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(32*17)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
}

func BenchmarkEncode(b *testing.B) {
	batch := benchBatch(32, 16, true)
	for _, layout := range []Layout{LayoutArray, LayoutMap} {
		b.Run([]string{"positional", "map"}[layout], func(b *testing.B) {
			var buf []byte
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if buf, err = AppendEncode(buf[:0], batch, layout); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(len(buf)))
		})
	}
}
