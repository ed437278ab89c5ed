package index

import "fmt"

// checkSummaries recomputes every key's summary (keyVal.gpu, .loose) from
// its record chain and compares; it also checks that every live record is
// linked under its key exactly once.
func (ix *Index) checkSummaries() error {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	linked := 0
	check := func(k uint64, kv keyVal) error {
		var want keyVal
		want.head = kv.head
		for r := kv.head; r != nilRec; r = ix.at(r).next {
			rc := ix.at(r)
			if rc.key != k || rc.server == freeSrv {
				return fmt.Errorf("key %x: chain holds record %d of key %x server %d", k, r, rc.key, rc.server)
			}
			want.addClass(rc, rc.class(), 1)
			linked++
		}
		if kv != want {
			return fmt.Errorf("key %x: summary %+v, chain says %+v", k, kv, want)
		}
		return nil
	}
	if ix.keys.zero {
		if err := check(0, ix.keys.zval); err != nil {
			return err
		}
	}
	for _, sl := range ix.keys.slots {
		if sl.k == 0 {
			continue
		}
		if err := check(sl.k, sl.v); err != nil {
			return err
		}
	}
	if live := int(ix.nrecs) - ix.nfree; linked != live {
		return fmt.Errorf("%d records linked under keys, %d live", linked, live)
	}
	return nil
}
