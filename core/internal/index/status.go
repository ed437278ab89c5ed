package index

// ServerStatus reports one server's share of the index.
type ServerStatus struct {
	Name        string `json:"name"`
	Entries     int    `json:"entries"`
	Bridged     int    `json:"bridged"`
	Approximate bool   `json:"approximate"`
	Capacity    int    `json:"capacity"`
	Stored      uint64 `json:"stored_blocks"`
	Removed     uint64 `json:"removed_blocks"`
	Cleared     uint64 `json:"cleared"`
	// ResetClears counts the clears taken as a weight sync's engine reset
	// reported late, and KeptSpeculative the live speculative entries
	// they kept (Index.Cleared).
	ResetClears     uint64 `json:"reset_clears"`
	KeptSpeculative uint64 `json:"kept_speculative"`
	Unanchored      uint64 `json:"unanchored_blocks"`
	Unresolved      uint64 `json:"unresolved_hashes"`
}

// Status summarises the index.
type Status struct {
	Entries         int            `json:"entries"`
	Keys            int            `json:"keys"`
	MaxEntries      int            `json:"max_entries"`
	Bytes           int64          `json:"bytes_estimate"`
	EvictedBudget   uint64         `json:"evicted_budget"`
	EvictedCapacity uint64         `json:"evicted_capacity"`
	Servers         []ServerStatus `json:"servers"`
}

// recBytes is the size of rec plus its engine-hash slot (checked by a test
// with unsafe.Sizeof).
const recBytes = 32 + 8

// Status returns counts and the index's memory: slab pages plus hash
// tables, counted exactly rather than estimated.
func (ix *Index) Status() Status {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := Status{
		Entries:         int(ix.nrecs) - ix.nfree,
		Keys:            ix.keys.Len(),
		MaxEntries:      ix.cfg.MaxEntries,
		EvictedBudget:   ix.evictedBudget,
		EvictedCapacity: ix.evictedCapacity,
	}
	bytes := int64(len(ix.pages))*pageSize*recBytes + ix.keys.Bytes()
	for _, s := range ix.servers {
		if s == nil {
			continue
		}
		bytes += s.bridge.Bytes()
		st.Servers = append(st.Servers, ServerStatus{
			Name: s.name, Entries: s.n, Bridged: s.bridge.Len(), Approximate: s.opts.Approximate,
			Capacity: s.opts.Capacity, Stored: s.stored, Removed: s.removed, Cleared: s.cleared,
			ResetClears: s.resetClears, KeptSpeculative: s.keptSpec,
			Unanchored: s.unanchored, Unresolved: s.unresolved,
		})
	}
	// The slab pages and the hash tables are the index; everything else
	// (server structs, names) is a few hundred bytes per server.
	st.Bytes = bytes
	return st
}

// Residency is one record as Snapshot reports it.
type Residency struct {
	Key uint64
	// Engine is the engine hash bridged to the record (0 = speculative only).
	Engine uint64
	// Copies counts resident copies per tier.
	Copies [NumTiers]int
	// Speculative is true while an unexpired speculative entry exists.
	Speculative bool
}

// Snapshot lists a server's records, for inspection and end-to-end checks
// against an engine's true cache contents. It is O(records of the server).
func (ix *Index) Snapshot(id ServerID) []Residency {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	s := ix.srv(id)
	if s == nil {
		return nil
	}
	now := ix.tick(ix.cfg.Now())
	out := make([]Residency, 0, s.n)
	for r := s.head; r != nilRec; r = ix.at(r).snext {
		rc := ix.at(r)
		out = append(out, Residency{Key: rc.key, Engine: *ix.eng(r), Speculative: rc.spec > now,
			Copies: [NumTiers]int{int(rc.cnt[0]), int(rc.cnt[1]), int(rc.cnt[2])}})
	}
	return out
}
