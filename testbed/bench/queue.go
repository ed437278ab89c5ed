package bench

import (
	"container/heap"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"github.com/kvc-router/kvc-router/testbed/sim"
)

// Router queue orders (Policy.QueuePolicy), after Dynamo's
// router_queue_policy (ai-dynamo/dynamo lib/kv-router/src/scheduling/
// policy.rs: FcfsPolicy, LcfsPolicy, WsptPolicy). Dynamo keys each request
// once, when it is queued, and serves the highest key first.
const (
	QueueFCFS = "fcfs"
	QueueLCFS = "lcfs"
	QueueWSPT = "wspt"
)

// parked is one request in the router queue.
type parked struct {
	it  *Item
	key float64
	seq uint64
}

// routerQueue serves the highest key first; equal keys in the order they
// were queued (Dynamo's heap leaves that order unspecified: FCFS is the
// tie-break a reader expects, and fcfs itself is all ties).
type routerQueue []parked

func (q routerQueue) Len() int { return len(q) }
func (q routerQueue) Less(i, j int) bool {
	if q[i].key != q[j].key {
		return q[i].key > q[j].key
	}
	return q[i].seq < q[j].seq
}
func (q routerQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *routerQueue) Push(x any)   { *q = append(*q, x.(parked)) }
func (q *routerQueue) Pop() any {
	old := *q
	p := old[len(old)-1]
	old[len(old)-1] = parked{}
	*q = old[:len(old)-1]
	return p
}

func (q *routerQueue) push(it *Item, key float64, seq uint64) { heap.Push(q, parked{it, key, seq}) }
func (q *routerQueue) pop() *Item                             { return heap.Pop(q).(parked).it }

// queueKey is the policy's priority for a request queued as the seq-th
// (1-based): fcfs earliest first, lcfs latest first, wspt Smith's rule
// 1 / new prefill tokens, the prompt's tokens less the best effective
// overlap any worker holds (at least 1). Dynamo's priority_jump and
// strict_priority are 0 here: kvbench's clients send neither.
func queueKey(policy string, seq uint64, promptTokens int, bestCached float64) float64 {
	switch policy {
	case QueueLCFS:
		return float64(seq)
	case QueueWSPT:
		return 1 / max(1, float64(promptTokens)-bestCached)
	}
	return 0
}

// residency mirrors one engine's cached blocks as the router has been told
// of them (KV events as delivered, so as stale as the router's index):
// what Dynamo's indexer answers wspt's overlap query from. Values are tier
// bits (tierBit).
type residency map[uint64]uint8

func tierBit(medium string) uint8 {
	switch medium {
	case sim.MediumCPU:
		return 2
	case sim.MediumStorage:
		return 4
	}
	return 1 // GPU, and vLLM's events without a medium
}

// apply records one delivered batch of events.
func (r residency) apply(evs []kvcrouter.Event) {
	for i := range evs {
		ev := &evs[i]
		switch ev.Kind {
		case kvcrouter.EventStored:
			b := tierBit(ev.Medium)
			for _, h := range ev.BlockHashes {
				r[h] |= b
			}
		case kvcrouter.EventRemoved:
			b := tierBit(ev.Medium)
			for _, h := range ev.BlockHashes {
				if v := r[h] &^ b; v == 0 {
					delete(r, h)
				} else {
					r[h] = v
				}
			}
		case kvcrouter.EventCleared:
			clear(r)
		}
	}
}

// effective is the cached prefix of a prompt with engine hashes hashes, in
// blocks, each tier weighted as Dynamo's cost weighs it (GPU 1, host and
// disk at their cache-hit weights): the prefix runs while some tier holds
// the block, counted in the fastest tier that does.
func (r residency) effective(hashes []uint64, hostW, diskW float64) float64 {
	var n float64
	for _, h := range hashes {
		switch b := r[h]; {
		case b&1 != 0:
			n++
		case b&2 != 0:
			n += hostW
		case b&4 != 0:
			n += diskW
		default:
			return n
		}
	}
	return n
}
