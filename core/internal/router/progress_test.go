package router

import (
	"fmt"
	"testing"
)

// checkProgress: every followed request sits in exactly one tip's list,
// the one it records, and the count read without the lock is the table's.
func checkProgress(t *testing.T, p *progress) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if int(p.n.Load()) != len(p.reqs) {
		t.Fatalf("count %d, %d requests followed", p.n.Load(), len(p.reqs))
	}
	seen := map[string]int{}
	for ref, ids := range p.tips {
		if len(ids) == 0 {
			t.Fatalf("empty list kept at %+v", ref)
		}
		for _, id := range ids {
			rp := p.reqs[id]
			if rp == nil || rp.tip != ref {
				t.Fatalf("%s listed at %+v, follows %+v", id, ref, rp)
			}
			seen[id]++
		}
	}
	for id := range p.reqs {
		if seen[id] != 1 {
			t.Fatalf("%s listed %d times", id, seen[id])
		}
	}
}

// FuzzProgress drives acquires, decode-block events (parented on any block
// an engine published, followed or not) and releases in any order: the
// tables stay consistent, and after every request is released nothing is
// followed.
func FuzzProgress(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0, 0, 16, 17, 18, 32, 33, 48, 49, 50, 1, 17, 33})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 512 {
			return
		}
		const bs = 4
		r := mustNew(t, Config{Mode: ModeKVCAware, Model: "m", BlockSize: bs, Lengths: LengthsSpec{Enabled: true}}, "ev")
		r.SetEventFeed("ev", true)
		w := writerOf(t, r, "ev")
		prompts := [][]int32{prompt(8, 1), prompt(10, 100), prompt(4, 200)}
		published := []uint64{}
		for pi, p := range prompts {
			hs := []uint64{uint64(1000*pi + 1), uint64(1000*pi + 2)}[:len(p)/bs]
			if err := w.Stored(0, false, 0, hs, p[:len(hs)*bs], bs, ""); err != nil {
				t.Fatal(err)
			}
			published = append(published, hs...)
		}
		next := uint64(1 << 20)
		for i, op := range ops {
			id := fmt.Sprint("r", op%4)
			switch op >> 4 % 3 {
			case 0:
				if _, err := r.Acquire(Request{ID: id, Tokens: prompts[int(op)%len(prompts)], Pin: -1}); err != nil {
					t.Fatal(err)
				}
			case 1:
				parent := published[int(op)%len(published)]
				blk := prompt(bs*(1+int(op)%2), int32(10000+i))
				hs := []uint64{next, next + 1}[:len(blk)/bs]
				next += 2
				if err := w.Stored(0, true, parent, hs, blk, bs, ""); err == nil {
					published = append(published, hs...)
				}
			case 2:
				r.ReleaseDone("ev", id, 0, nil)
			}
			checkProgress(t, r.lens.prog)
		}
		for k := 0; k < 4; k++ {
			r.ReleaseDone("ev", fmt.Sprint("r", k), 0, nil)
		}
		checkProgress(t, r.lens.prog)
		if n := r.lens.prog.n.Load(); n != 0 {
			t.Fatalf("%d requests followed after every release", n)
		}
	})
}
