package peers

import (
	"encoding/json"
	"fmt"
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"math"
	"os"
	"sort"
	"strings"
	"testing"
)

// The differential test of kvbench's dynamo_cost against the real Dynamo KV
// router (ai-dynamo-runtime's dynamo._core.KvRouter at KvRouterConfig()
// defaults). testbed/scripts/dynamo_diff.py drives the real router over 4 workers
// with KV events (publish_stored / publish_removed) and a seeded stream of
// best_worker(request_id) / mark_prefill_complete / free calls, and records
// every operation with Dynamo's choice and its get_potential_loads answer.
// This test replays the same operations through Dynamo.Cost with the bench
// driver's router-local accounting (testbed/bench/driver.go: prefill =
// uncached prompt tokens / block size until the first token, decode = unique
// active full prompt blocks, new = the request's full blocks not already
// active) and the router's prefix match (capped at
// the hittable blocks, as vLLM recomputes the last token), follows Dynamo's
// choice so both sides keep the same state, and compares decisions.
//
// KVR_DYNAMO_TRACE names a freshly recorded trace (tests/test_dynamo.py
// records one and runs this test on it); otherwise testdata/dynamo_trace.json.

type diffTrace struct {
	BlockSize int      `json:"block_size"`
	Workers   int      `json:"workers"`
	Dynamo    string   `json:"dynamo"`
	Ops       []diffOp `json:"ops"`
}

type diffOp struct {
	Op         string     `json:"op"`
	ID         string     `json:"id"`
	Tokens     []int32    `json:"tokens"`
	Worker     int        `json:"worker"`
	Overlap    int        `json:"overlap"`
	FirstBlock int        `json:"first_block"`
	Blocks     int        `json:"blocks"`
	Loads      []diffLoad `json:"loads"`
}

type diffLoad struct {
	Worker        int `json:"worker"`
	PrefillTokens int `json:"prefill_tokens"`
	DecodeBlocks  int `json:"decode_blocks"`
	Active        int `json:"active"`
}

type diffReq struct {
	worker    int
	keys      []string
	prefill   float64
	prefilled bool
	// capped is the prefill (blocks) kvbench charges beyond Dynamo because
	// its hit is capped at the hittable blocks.
	capped     float64
	indexDelta float64
}

type diffWorker struct {
	stored     map[string]bool
	blocks     map[string]int
	nseq       int
	prefill    float64
	capped     float64
	indexDelta float64
}

// diffState is the replayed fleet; it implements Signals for one request.
type diffState struct {
	bs      int
	workers []*diffWorker
	reqs    map[string]*diffReq
	curKeys []string
}

func chainKeys(tokens []int32, bs int) []string {
	out := make([]string, 0, len(tokens)/bs)
	var b strings.Builder
	for i := 0; i+bs <= len(tokens); i += bs {
		for _, t := range tokens[i : i+bs] {
			fmt.Fprintf(&b, "%d,", t)
		}
		b.WriteByte('|')
		out = append(out, b.String())
	}
	return out
}

func (s *diffState) Metrics(string) (kvcrouter.LoadMetrics, bool) {
	return kvcrouter.LoadMetrics{}, false
}

func (s *diffState) Active(server, _ string) (Active, bool) {
	var w int
	fmt.Sscanf(server, "w%d", &w)
	e := s.workers[w]
	fresh := 0.0
	for _, k := range s.curKeys {
		if e.blocks[k] == 0 {
			fresh++
		}
	}
	return Active{PrefillBlocks: e.prefill, DecodeBlocks: float64(len(e.blocks)), NewBlocks: fresh}, true
}

func (s *diffState) Session(string) (string, bool) { return "", false }

func loadDiffTrace(t *testing.T) (diffTrace, string) {
	path := os.Getenv("KVR_DYNAMO_TRACE")
	if path == "" {
		path = "testdata/dynamo_trace.json"
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	var tr diffTrace
	if err := json.Unmarshal(raw, &tr); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	return tr, path
}

func TestDynamoDifferential(t *testing.T) {
	tr, path := loadDiffTrace(t)
	if tr.BlockSize <= 0 || tr.Workers <= 1 {
		t.Fatalf("%s: bad trace header", path)
	}
	st := &diffState{bs: tr.BlockSize, reqs: map[string]*diffReq{}}
	for range tr.Workers {
		st.workers = append(st.workers, &diffWorker{stored: map[string]bool{}, blocks: map[string]int{}})
	}
	cfg := DefaultDynamo()
	cfg.BlockSize = tr.BlockSize
	d, err := NewDynamo(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	tokensOf := map[string][]int32{}
	var decisions, agree, overlapSame int
	var disagreements []string
	why := map[string]int{}
	for n, op := range tr.Ops {
		switch op.Op {
		case "route":
			decisions++
			keys := chainKeys(op.Tokens, tr.BlockSize)
			tokensOf[op.ID] = op.Tokens
			st.curKeys = keys
			hittable := (len(op.Tokens) - 1) / tr.BlockSize
			req := &kvcrouter.ScoreRequest{ID: op.ID, Tokens: op.Tokens}
			costs := make([]float64, tr.Workers)
			hits := make([]int, tr.Workers)
			fullHits := make([]int, tr.Workers)
			for w, e := range st.workers {
				for _, k := range keys {
					if !e.stored[k] {
						break
					}
					fullHits[w]++
				}
				hits[w] = min(fullHits[w], hittable)
				c := kvcrouter.Candidate{ID: fmt.Sprintf("w%d", w), Hit: kvcrouter.Match{Blocks: hits[w]}, HittableBlocks: hittable}
				c.Hit.Tier[kvcrouter.TierGPU] = hits[w]
				costs[w] = d.Cost(req, &c)
			}
			best := math.Inf(1)
			for _, c := range costs {
				best = math.Min(best, c)
			}
			var argmin []int
			for w, c := range costs {
				if c == best {
					argmin = append(argmin, w)
				}
			}
			if fullHits[op.Worker] == op.Overlap {
				overlapSame++
			} else if os.Getenv("KVR_DIFF_DEBUG") != "" {
				t.Logf("op %d %s: overlap on w%d: dynamo %d, replay %d", n, op.ID, op.Worker, op.Overlap, fullHits[op.Worker])
			}
			ok := false
			for _, w := range argmin {
				ok = ok || w == op.Worker
			}
			if os.Getenv("KVR_DIFF_DEBUG") != "" {
				for w, e := range st.workers {
					a, _ := st.Active(fmt.Sprintf("w%d", w), "")
					for _, l := range op.Loads {
						if l.Worker == w {
							t.Logf("op %d w%d: go prefill %.2f blk (active %.2f + req %.2f - hit %d) decode %.0f+%.0f | dyn prefill %d tok = %.2f blk decode %d active %d nseq %d ok=%v",
								n, w, a.PrefillBlocks+float64(len(op.Tokens))/float64(tr.BlockSize)-float64(hits[w]), a.PrefillBlocks,
								float64(len(op.Tokens))/float64(tr.BlockSize), hits[w], a.DecodeBlocks, a.NewBlocks,
								l.PrefillTokens, float64(l.PrefillTokens)/float64(tr.BlockSize), l.DecodeBlocks, l.Active, e.nseq, ok)
						}
					}
				}
			}
			if ok {
				agree++
			} else {
				reason := explain(op, st, costs, fullHits, hits, tr.BlockSize)
				why[reason]++
				disagreements = append(disagreements, fmt.Sprintf("op %d %s: dynamo chose w%d, dynamo_cost argmin %v costs %v; %s",
					n, op.ID, op.Worker, argmin, costs, reason))
			}
			// Follow Dynamo's choice (both sides keep the same state).
			e := st.workers[op.Worker]
			r := &diffReq{worker: op.Worker, keys: keys,
				prefill: math.Max(0, float64(len(op.Tokens)-hits[op.Worker]*tr.BlockSize)) / float64(tr.BlockSize),
				capped:  float64(fullHits[op.Worker] - hits[op.Worker])}
			// Dynamo's own overlap differed from the replayed index state:
			// its prefill charge differs by that many blocks.
			r.indexDelta = float64(op.Overlap - fullHits[op.Worker])
			e.indexDelta += r.indexDelta
			e.prefill += r.prefill
			e.capped += r.capped
			for _, k := range keys {
				e.blocks[k]++
			}
			e.nseq++
			st.reqs[op.ID] = r
		case "prefill_done":
			r := st.reqs[op.ID]
			if r == nil {
				t.Fatalf("op %d: prefill_done of unknown %s", n, op.ID)
			}
			if !r.prefilled {
				r.prefilled = true
				st.workers[r.worker].prefill -= r.prefill
				st.workers[r.worker].capped -= r.capped
				st.workers[r.worker].indexDelta -= r.indexDelta
			}
		case "free":
			r := st.reqs[op.ID]
			if r == nil {
				t.Fatalf("op %d: free of unknown %s", n, op.ID)
			}
			e := st.workers[r.worker]
			if !r.prefilled {
				e.prefill -= r.prefill
				e.capped -= r.capped
				e.indexDelta -= r.indexDelta
			}
			for _, k := range r.keys {
				if e.blocks[k]--; e.blocks[k] <= 0 {
					delete(e.blocks, k)
				}
			}
			e.nseq--
			delete(st.reqs, op.ID)
		case "stored":
			keys := chainKeys(tokensOf[op.ID], tr.BlockSize)
			for _, k := range keys[op.FirstBlock : op.FirstBlock+op.Blocks] {
				st.workers[op.Worker].stored[k] = true
			}
		case "removed":
			keys := chainKeys(op.Tokens, tr.BlockSize)
			delete(st.workers[op.Worker].stored, keys[len(keys)-1])
		default:
			t.Fatalf("op %d: unknown op %q", n, op.Op)
		}
	}
	rate := float64(agree) / float64(decisions)
	reasons := make([]string, 0, len(why))
	for r, c := range why {
		reasons = append(reasons, fmt.Sprintf("%d× %s", c, r))
	}
	sort.Strings(reasons)
	t.Logf("%s (%s): %d decisions, dynamo_cost agrees with dynamo._core on %d (%.1f%%); overlap identical on %d; disagreements by cause: %v",
		path, tr.Dynamo, decisions, agree, 100*rate, overlapSame, reasons)
	for _, s := range disagreements {
		t.Log(s)
	}
	if decisions < 100 {
		t.Fatalf("trace has only %d decisions", decisions)
	}
	if why[unexplained] > 0 {
		t.Errorf("%d disagreements not explained by a known difference", why[unexplained])
	}
	if rate < diffMinAgreement {
		t.Errorf("agreement %.1f%% below %.0f%%", 100*rate, 100*diffMinAgreement)
	}
}

// diffMinAgreement is the agreement the test requires; the measured rate and
// every disagreement's cause are in the test log (docs/arena.md).
const diffMinAgreement = 0.9

const unexplained = "unexplained"

// explain classifies a disagreement by the known differences between the
// re-implementation's inputs and Dynamo's (its potential loads, recorded
// just before the decision, are the ground truth for Dynamo's side).
func explain(op diffOp, st *diffState, costs []float64, fullHits, hits []int, bs int) string {
	// Dynamo's own cost from its reported loads: prefill tokens / bs + decode blocks.
	dyn := make([]float64, len(costs))
	for _, l := range op.Loads {
		if l.Worker >= 0 && l.Worker < len(dyn) {
			dyn[l.Worker] = float64(l.PrefillTokens)/float64(bs) + float64(l.DecodeBlocks)
		}
	}
	dynBest := math.Inf(1)
	for _, c := range dyn {
		dynBest = math.Min(dynBest, c)
	}
	if dyn[op.Worker] != dynBest {
		return "dynamo chose off its own potential-load argmin (its selector's tie or load state moved between the query and the decision)"
	}
	// Without kvbench's hittable cap (on this request and on the active
	// requests still prefilling), would Dynamo's choice be an argmin?
	alt := make([]float64, len(costs))
	altBest := math.Inf(1)
	for w := range costs {
		alt[w] = costs[w] - st.workers[w].capped - float64(fullHits[w]-hits[w])
		altBest = math.Min(altBest, alt[w])
	}
	if math.Abs(alt[op.Worker]-altBest) < 1e-9 && altBest < math.Inf(1) {
		return "hittable cap: kvbench credits at most (len-1)/bs blocks of a prompt (vLLM recomputes the last token), Dynamo every matched full block; on this request or an active one still prefilling"
	}
	// With the overlaps Dynamo itself reported for the active requests
	// still prefilling (where its index and the replay's event state
	// differed), would its choice be an argmin?
	altBest = math.Inf(1)
	for w := range costs {
		alt[w] = costs[w] - st.workers[w].indexDelta
		if w == op.Worker { // this request's own overlap as Dynamo reported it
			alt[w] -= math.Max(0, float64(op.Overlap-fullHits[w]))
		}
		altBest = math.Min(altBest, alt[w])
	}
	if math.Abs(alt[op.Worker]-altBest) < 1e-9 {
		return "index state: Dynamo reported a longer overlap than the published events give (its index kept a block after its BlockRemoved event), on this request or an earlier one still prefilling on the chosen worker, so it charges that worker less prefill"
	}
	for w := range costs {
		if math.Abs(costs[w]-dyn[w]) > 1.01 {
			return "load accounting: kvbench's router-local prefill/decode blocks differ from Dynamo's by more than one block"
		}
	}
	return "within one block of a tie: partial-block rounding (kvbench counts len/bs+1 prompt blocks, Dynamo tokens/bs)"
}
