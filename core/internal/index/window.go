// Sliding-window residency for hybrid-attention models: what a server's
// sliding-window KV-cache group holds, and the hit the engine serves from it.

package index

// window is what one server's sliding-window group holds, by engine hash.
// vLLM hashes a block the same way for every KV-cache group (the group is
// part of the cache key, not of the hash), so the engine hash of a window
// block names the same block as the full-attention group's record.
type window struct {
	// need is the number of contiguous blocks a hit must end on:
	// ceil((sliding_window-1)/block_size), vLLM's
	// SlidingWindowManager._contiguous_blocks_for_hit.
	need int
	held map[uint64]uint32 // engine hash -> copies stored and not removed
}

// WindowStored records blocks a server's sliding-window group holds (its
// BlockStored events), and the contiguous run a hit needs there. From the
// first call on, matches for the server are trimmed by TrimWindow.
func (ix *Index) WindowStored(id ServerID, engineHashes []uint64, need int) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.srv(id)
	if s == nil {
		return ErrUnknownServer
	}
	if s.win == nil {
		s.win = &window{held: make(map[uint64]uint32)}
	}
	if need > 0 {
		s.win.need = need
	}
	for _, e := range engineHashes {
		s.win.held[e]++
	}
	return nil
}

// WindowRemoved applies the sliding-window group's BlockRemoved events.
func (ix *Index) WindowRemoved(id ServerID, engineHashes []uint64) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.srv(id)
	if s == nil {
		return ErrUnknownServer
	}
	if s.win == nil {
		return nil
	}
	for _, e := range engineHashes {
		switch n := s.win.held[e]; {
		case n > 1:
			s.win.held[e] = n - 1
		case n == 1:
			delete(s.win.held, e)
		default:
			s.unresolved++
		}
	}
	return nil
}

// TrimWindow lowers m (a MatchPrefix answer for server id over keys) to
// the hit a hybrid engine serves: vLLM checks the full-attention groups
// first (the leading run m.Blocks), then the sliding-window group scans
// from that boundary down for the last position ending a run of `need`
// contiguous window blocks; without one, only a leading run of window
// blocks counts. Servers without a window group are left as they are.
// A block the router presumes resident (speculation, no engine hash yet)
// counts as held: the engine computes it with the request that put it
// there, and a window group keeps a run's last blocks.
func (ix *Index) TrimWindow(id ServerID, keys []uint64, m *Match) {
	if m.Blocks == 0 {
		return
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	s := ix.srv(id)
	if s == nil || s.win == nil || s.win.need <= 0 {
		return
	}
	now := ix.tick(ix.cfg.Now())
	n := min(m.Blocks, len(keys))
	recs := make([]uint32, n)
	for i := 0; i < n; i++ {
		recs[i] = ix.recordOf(id, keys[i])
	}
	held := func(i int) bool {
		r := recs[i]
		if r == nilRec {
			return false
		}
		if e := *ix.eng(r); e != 0 {
			return s.win.held[e] > 0 || ix.at(r).spec > now && ix.at(r).cnt[GPU] == 0
		}
		return ix.at(r).spec > now
	}
	hit := windowHit(n, s.win.need, held)
	if hit >= m.Blocks {
		return
	}
	var t [NumTiers]int
	for i := 0; i < hit; i++ {
		rc := ix.at(recs[i])
		switch {
		case rc.cnt[GPU] > 0 || rc.spec > now:
			t[GPU]++
		case rc.cnt[CPU] > 0:
			t[CPU]++
		default:
			t[SSD]++
		}
	}
	m.Blocks, m.Tier = hit, t
}

// windowHit is vLLM's sliding-window hit over blocks [0, full): the right-
// most i such that blocks [i, i+need) are all held gives i+need; failing
// that, the leading run of held blocks.
func windowHit(full, need int, held func(int) bool) int {
	run := 0
	for i := full - 1; i >= 0; i-- {
		if !held(i) {
			run = 0
			continue
		}
		run++
		if run >= need {
			return i + run
		}
	}
	return run
}

// recordOf is server id's record for key, or nilRec.
func (ix *Index) recordOf(id ServerID, key uint64) uint32 {
	kv, ok := ix.keys.Get(key)
	if !ok {
		return nilRec
	}
	for r := kv.head; r != nilRec; {
		rc := ix.at(r)
		if rc.server == uint16(id) {
			return r
		}
		r = rc.next
	}
	return nilRec
}
