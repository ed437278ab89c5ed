package index

// candidatePos maps server ids to their 1-based position in ids (0 for a
// server that is not a candidate), in scratch grown to the server table.
// The caller holds the lock.
func (ix *Index) candidatePos(ids []ServerID, scratch []int32) []int32 {
	if cap(scratch) < len(ix.servers) {
		scratch = make([]int32, len(ix.servers))
	}
	pos := scratch[:len(ix.servers)]
	for i := range pos {
		pos[i] = 0
	}
	for i, id := range ids {
		if int(id) < len(pos) {
			pos[id] = int32(i + 1)
		}
	}
	return pos
}
