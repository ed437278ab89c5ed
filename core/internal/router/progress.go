package router

import (
	"sync"
	"sync/atomic"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
	"github.com/kvc-router/kvc-router/core/internal/index"
)

// progress follows in-flight requests' decoding through KV events, so the
// length learner gets token counts from a caller that never reports them
// (verl without the hook releases with the server id alone; issue 26,
// "without the hook"). vLLM publishes a BlockStored for every block a
// running request fills, its parent the block before: a request's first
// block of output hangs off its prompt's last full block, and each later
// one off the block before it. Following that chain from the prompt's tip
// counts the request's full output blocks; its last, partial block is
// never published, so the count is a lower bound (by less than a block).
//
// Siblings share their prompt's tip: the first output block that hangs off
// it goes to the sibling tracked first, and from there each chain is its
// own. A request preempted and recomputed re-publishes blocks whose parents
// lie behind its tip, which are not counted again. It is safe for
// concurrent use: collectors call stored without the router's lock.
type progress struct {
	mu   sync.Mutex
	tips map[tipRef][]string // a chain tip -> the requests it may extend
	reqs map[string]*reqProgress
	n    atomic.Int64 // len(reqs), read without mu on the event path
}

type tipRef struct {
	srv index.ServerID
	key uint64
}

type reqProgress struct {
	tip    tipRef
	blocks int // output blocks followed so far
	bs     int
	tail   int // prompt tokens in the first output block
}

func newProgress() *progress {
	return &progress{tips: map[tipRef][]string{}, reqs: map[string]*reqProgress{}}
}

// track starts following request id, placed on srv, whose prompt's last
// full block has key tip (blocks of bs tokens, tail prompt tokens after it).
// An id tracked again (a session's next turn) starts over.
func (p *progress) track(id string, srv index.ServerID, tip uint64, bs, tail int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropLocked(id)
	if len(p.reqs) >= maxLengthFlights {
		// Callers that never release by id would grow it forever.
		clear(p.reqs)
		clear(p.tips)
	}
	ref := tipRef{srv, tip}
	p.reqs[id] = &reqProgress{tip: ref, bs: bs, tail: tail}
	p.tips[ref] = append(p.tips[ref], id)
	p.n.Store(int64(len(p.reqs)))
}

// done stops following id and returns the output tokens its events showed
// (0 when none or not followed).
func (p *progress) done(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	rp := p.reqs[id]
	if rp == nil {
		return 0
	}
	p.dropLocked(id)
	p.n.Store(int64(len(p.reqs)))
	return max(0, rp.blocks*rp.bs-rp.tail)
}

func (p *progress) dropLocked(id string) {
	rp := p.reqs[id]
	if rp == nil {
		return
	}
	delete(p.reqs, id)
	p.unlinkLocked(rp.tip, id)
}

func (p *progress) unlinkLocked(ref tipRef, id string) {
	ids := p.tips[ref]
	for i, x := range ids {
		if x == id {
			ids = append(ids[:i], ids[i+1:]...)
			break
		}
	}
	if len(ids) == 0 {
		delete(p.tips, ref)
	} else {
		p.tips[ref] = ids
	}
}

// stored sees one BlockStored run applied to srv's records: when its
// parent is a followed request's tip, the run's full blocks are that
// request's output.
func (p *progress) stored(ix *index.Index, srv index.ServerID, parent uint64, tokens []int32, bs int) {
	if p.n.Load() == 0 || bs <= 0 {
		return
	}
	n := len(tokens) / bs
	if n == 0 {
		return
	}
	key, ok := ix.KeyOf(srv, parent)
	if !ok {
		return
	}
	ref := tipRef{srv, key}
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := p.tips[ref]
	if len(ids) == 0 {
		return
	}
	id := ids[0]
	rp := p.reqs[id]
	if rp == nil || rp.bs != bs {
		return
	}
	p.unlinkLocked(ref, id)
	for j := 0; j < n; j++ {
		key = blockhash.Chain(key, tokens[j*bs:(j+1)*bs])
	}
	rp.blocks += n
	rp.tip = tipRef{srv, key}
	p.tips[rp.tip] = append(p.tips[rp.tip], id)
}
