package bench

import (
	"math"
	"sort"

	"github.com/kvc-router/kvc-router/testbed/sim"
)

// Record is one request as the bounds see it: the chained keys of every
// full block of prompt+output (at the engine block size) and how many of
// them belong to the prompt.
type Record struct {
	Phase        int
	At           float64
	Seq          int
	PromptLen    int
	PromptBlocks int
	Keys         []uint64
	// OutputLen is the number of generated tokens.
	OutputLen int
	// Chain names the dependency chain the request belongs to (an agent
	// trajectory; "" = independent), Think the delay between the chain's
	// previous completion and this request's arrival (tool latency), and
	// First the arrival of the chain's first request (policy-independent).
	Chain string
	Think float64
	First float64
	// Routed is when the router placed the request (after At when a
	// router queue or admission held it).
	Routed float64
	// Engine is the index of the engine that ran it.
	Engine int
}

func sortRecords(recs []Record) []Record {
	out := append([]Record(nil), recs...)
	sort.SliceStable(out, func(a, b int) bool {
		if out[a].Phase != out[b].Phase {
			return out[a].Phase < out[b].Phase
		}
		if out[a].At != out[b].At {
			return out[a].At < out[b].At
		}
		return out[a].Seq < out[b].Seq
	})
	return out
}

// Oracle is the infinite-cache, perfect-routing token hit rate (an upper
// bound on any policy's hit rate): requests in arrival order; a request whose first k prompt blocks
// were seen before (in the same phase: a weight update invalidates every
// cache) scores min(blockSize·k, prompt length). Every block of the
// request's prompt and output is then remembered.
func Oracle(recs []Record, blockSize int) float64 {
	var hit, total float64
	seen := map[uint64]struct{}{}
	phase := math.MinInt
	for _, r := range sortRecords(recs) {
		if r.Phase != phase {
			clear(seen)
			phase = r.Phase
		}
		k := 0
		for k < r.PromptBlocks {
			if _, ok := seen[r.Keys[k]]; !ok {
				break
			}
			k++
		}
		hit += math.Min(float64(blockSize*k), float64(r.PromptLen))
		total += float64(r.PromptLen)
		for _, key := range r.Keys {
			seen[key] = struct{}{}
		}
	}
	if total == 0 {
		return 0
	}
	return hit / total
}

// PooledLRU is a reference, not a bound: the token hit rate of one LRU
// cache of capacity blocks (all engines' GPU capacity pooled), requests in arrival order, cleared at
// phase changes. Hits are the longest resident prompt prefix; then every
// block of the request is touched tail first, so that, as in vLLM (which
// frees a request's blocks in reverse order), a prefix outlives its tail.
// In-flight pinning is ignored, and LRU is not the optimal replacement,
// so a routing policy can exceed it.
func PooledLRU(recs []Record, blockSize, capacity int) float64 {
	if capacity <= 0 {
		return 0
	}
	l := newLRU(capacity)
	var hit, total float64
	phase := math.MinInt
	for _, r := range sortRecords(recs) {
		if r.Phase != phase {
			l = newLRU(capacity)
			phase = r.Phase
		}
		k := 0
		for k < r.PromptBlocks && l.has(r.Keys[k]) {
			k++
		}
		hit += math.Min(float64(blockSize*k), float64(r.PromptLen))
		total += float64(r.PromptLen)
		for i := len(r.Keys) - 1; i >= 0; i-- {
			l.touch(r.Keys[i])
		}
	}
	if total == 0 {
		return 0
	}
	return hit / total
}

// lru is a fixed-capacity LRU set of keys on index-linked nodes.
type lru struct {
	cap        int
	pos        map[uint64]int32
	key        []uint64
	prev, next []int32
	head, tail int32 // head = most recent
}

func newLRU(capacity int) *lru {
	return &lru{cap: capacity, pos: make(map[uint64]int32, capacity), head: -1, tail: -1}
}

func (l *lru) has(k uint64) bool { _, ok := l.pos[k]; return ok }

func (l *lru) unlink(i int32) {
	p, n := l.prev[i], l.next[i]
	if p >= 0 {
		l.next[p] = n
	} else {
		l.head = n
	}
	if n >= 0 {
		l.prev[n] = p
	} else {
		l.tail = p
	}
}

func (l *lru) pushFront(i int32) {
	l.prev[i], l.next[i] = -1, l.head
	if l.head >= 0 {
		l.prev[l.head] = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}

func (l *lru) touch(k uint64) {
	if i, ok := l.pos[k]; ok {
		if i != l.head {
			l.unlink(i)
			l.pushFront(i)
		}
		return
	}
	var i int32
	if len(l.key) < l.cap {
		i = int32(len(l.key))
		l.key = append(l.key, k)
		l.prev = append(l.prev, -1)
		l.next = append(l.next, -1)
	} else {
		i = l.tail
		l.unlink(i)
		delete(l.pos, l.key[i])
		l.key[i] = k
	}
	l.pos[k] = i
	l.pushFront(i)
}

// LowerBound is a makespan no routing policy can beat on the engine model
// (sim.Config's step time: StepBase + PrefillPerToken·prefill tokens +
// DecodePerToken·decode tokens + DecodePerContextToken·Σ decode context;
// the prefill attention term is left out, which keeps it a bound). Per phase it is the larger of
//
//   - the chain bound: the longest chain of dependent requests (an agent
//     trajectory's turns and the tool latencies between them; a GRPO sample
//     alone), each request run alone on an idle engine with its prompt
//     fully cached but for one token, started at its phase-relative arrival;
//   - the work bound: the phase's least total engine time — every distinct
//     full prompt block prefilled once anywhere (KV shared, no preemption;
//     a block some request generated counts as already computed, since
//     decoding wrote its KV),
//     every decode step's context cost, and the step overhead of the fewest
//     decode steps possible (each holds at most MaxNumSeqs sequences whose
//     unshared generated tokens fit in the GPU KV cache) — spread evenly
//     over the engines.
//
// Both parts ignore KV capacity, queueing and scheduling, so the bound is
// loose where those dominate; it is never above an achievable makespan.
func LowerBound(recs []Record, cfg sim.Config, engines int) (total float64, perPhase []float64) {
	cfg = cfg.WithDefaults()
	if engines <= 0 || len(recs) == 0 {
		return 0, nil
	}
	bs := cfg.BlockSize
	sorted := sortRecords(recs)
	type chainKey struct {
		phase int
		key   string
	}
	for lo := 0; lo < len(sorted); {
		phase := sorted[lo].Phase
		hi := lo
		for hi < len(sorted) && sorted[hi].Phase == phase {
			hi++
		}
		start := math.Inf(1)
		for _, r := range sorted[lo:hi] {
			start = math.Min(start, r.First)
		}
		seen := map[uint64]struct{}{}
		chains := map[chainKey]float64{}
		var prefillTok, decodeSlots, ctxTok, privTok float64
		longest := 0.0
		for _, r := range sorted[lo:hi] {
			for _, k := range r.Keys[:r.PromptBlocks] {
				if _, ok := seen[k]; !ok {
					seen[k] = struct{}{}
					prefillTok += float64(bs)
				}
			}
			prefillTok += float64(max(1, r.PromptLen-r.PromptBlocks*bs))
			// The engine wrote the KV of the generated tokens while decoding
			// them: a later prompt that contains this output (the next turn
			// of a trajectory) reuses those blocks without prefilling them.
			for _, k := range r.Keys[r.PromptBlocks:] {
				seen[k] = struct{}{}
			}
			o := float64(max(0, r.OutputLen-1))
			decodeSlots += o
			ctx := o*float64(r.PromptLen) + o*(o+1)/2
			ctxTok += ctx
			privTok += o * (o + 1) / 2
			alone := cfg.StepBase*(o+1) + cfg.PrefillPerToken + cfg.DecodePerToken*o + cfg.DecodePerContextToken*ctx
			if r.Chain == "" {
				longest = math.Max(longest, r.First-start+alone)
				continue
			}
			ck := chainKey{phase, r.Chain}
			if _, ok := chains[ck]; !ok {
				chains[ck] = r.First - start
			}
			chains[ck] += r.Think + alone
		}
		for _, c := range chains {
			longest = math.Max(longest, c)
		}
		// Decode steps: each holds at most MaxNumSeqs sequences, and the
		// KV they attend to fits the GPU cache; a sequence's own generated
		// tokens are never shared, so Σ over its decode steps of them is
		// KV occupancy no sharing removes.
		steps := math.Max(decodeSlots/float64(cfg.MaxNumSeqs), privTok/float64(cfg.NumGPUBlocks*bs))
		work := cfg.PrefillPerToken*prefillTok + cfg.DecodePerToken*decodeSlots + cfg.DecodePerContextToken*ctxTok +
			cfg.StepBase*math.Ceil(steps)
		b := math.Max(longest, work/float64(engines))
		perPhase = append(perPhase, b)
		total += b
		lo = hi
	}
	return total, perPhase
}
