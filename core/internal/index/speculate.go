// Speculative residency: what the router presumes a server holds because
// it just sent the prompt there.

package index

// Speculate records keys as presumed resident on a server's GPU tier because
// the router just sent them there. The entries expire after SpecTTL (event
// feed) or ApproxTTL (approximate server).
func (ix *Index) Speculate(id ServerID, keys []uint64) {
	if len(keys) == 0 {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.srv(id)
	if s == nil {
		return
	}
	ttl := ix.cfg.SpecTTL
	if s.opts.Approximate {
		ttl = ix.cfg.ApproxTTL
	}
	now := ix.cfg.Now()
	exp := ix.tick(now.Add(ttl))
	for _, k := range keys {
		r := ix.findOrCreate(id, s, k)
		if rc := ix.at(r); rc.spec < exp {
			was := rc.class()
			rc.spec = exp
			ix.reclass(rc, was)
		}
		ix.touch(r, s)
	}
	ix.sweepExpired(s, ix.tick(now))
	ix.enforceCapacity(s)
	ix.enforceBudget()
}

// sweepExpired frees speculative-only records at the cold end of a server's
// list once they have expired, so that unconfirmed speculation does not
// crowd the budget.
func (ix *Index) sweepExpired(s *server, now uint32) {
	for i := 0; i < 64 && s.tail != nilRec; i++ {
		rc := ix.at(s.tail)
		if !rc.empty() || rc.spec > now {
			return
		}
		ix.freeRec(s.tail, s)
	}
}
