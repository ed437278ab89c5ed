package router

import "github.com/hashicorp/golang-lru/v2/simplelru"

// Groups: how many of one prompt's requests (a GRPO group's samples, an
// agent task's first turns) the router placed on each server since the
// last weight sync. kvc_aware reads it as Candidate.Siblings (its
// group_spread term): a group's responses have correlated lengths, so a
// group kept whole on one server makes that server the step's straggler
// when the group is long (issue 26), while spreading it costs one prompt
// prefill per extra server.
//
// A group is keyed by its prompt's last hittable block key (the chain
// hash of every full block before it), the identity admission already
// uses for siblings. Counts are per step: ResetCache (a weight sync)
// clears them, and an LRU bounds the prompts remembered.

// maxPromptGroups bounds the prompts whose placements are remembered; a step
// with more distinct prompts forgets its oldest (they then spread as if
// new, which costs at most one prefill each).
const maxPromptGroups = 1 << 16

type groupCount struct {
	s *server
	n int
}

// groupPlaced is one prompt's placements per server (usually a few
// servers: a linear scan beats a map).
type groupPlaced []groupCount

func newGroups() *simplelru.LRU[uint64, groupPlaced] {
	g, err := simplelru.NewLRU[uint64, groupPlaced](maxPromptGroups, nil)
	if err != nil {
		panic(err) // maxPromptGroups > 0: unreachable
	}
	return g
}

// groupKeyOf is the group key of the request just matched (0: the prompt
// has no hittable block, so it has no siblings to count); r.mu held,
// after matchPrefix.
func (r *Router) groupKeyOf(n int) uint64 {
	if n == 0 {
		return 0
	}
	h := r.cands[0].HittableBlocks
	keys := r.keys[r.bsizes[0]]
	if h == 0 || len(keys) < h {
		return 0
	}
	return keys[h-1]
}

// fillSiblings sets each candidate's Siblings for group key g; r.mu held.
func (r *Router) fillSiblings(g uint64, n int) {
	if g == 0 || r.groups == nil {
		return
	}
	placed, ok := r.groups.Peek(g)
	if !ok {
		return
	}
	for i := 0; i < n; i++ {
		for _, c := range placed {
			if c.s == r.cpool[i] {
				r.cands[i].Siblings = c.n
				break
			}
		}
	}
}

// placed counts one request of group g on s; r.mu held.
func (r *Router) placed(g uint64, s *server) {
	if g == 0 || r.groups == nil || s == nil {
		return
	}
	p, _ := r.groups.Get(g)
	for i := range p {
		if p[i].s == s {
			p[i].n++
			return
		}
	}
	r.groups.Add(g, append(p, groupCount{s: s, n: 1}))
}

// counts is p by server id (tests and status).
func (p groupPlaced) counts() map[string]int {
	m := make(map[string]int, len(p))
	for _, c := range p {
		m[c.s.id] = c.n
	}
	return m
}
