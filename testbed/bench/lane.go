package bench

import (
	"fmt"
	"math"
)

// LaneSpec is the longest_lane+truelen reference row's plan: a reference,
// not a policy, since it reads every request's true response length.
//
// Why it exists: a step ends with its longest responses, and on the HBM
// engine model a sequence decodes several times faster on an engine with
// a small batch and little context (about 6 ms a step) than in a full one
// (about 30 ms once the KV cache is full). Placement that balances work,
// with or without true lengths, leaves the longest responses decoding in
// full batches, so it ties verl_default. This row shows what isolating
// them buys: responses of at least ThresholdTokens all go to the first
// engine (the lane), and every other request goes to the engine with the
// least planned work, the lane counting its planned work ÷ LaneShare, so
// it takes that share of the others' work next to its long responses.
// The defaults were chosen on tuning seeds 101–104 of the issue-26 shape
// (thresholds 8,500–11,000 and shares 0.25–0.35 at ρ 0.5, ρ 0.8 and the
// recurring step; below 9,000 the lane's long responses outgrow its KV and
// preempt, above 10,000 the responses left outside decode in full batches
// and end the step): docs/rl-workloads.md, "How far any order gets".
type LaneSpec struct {
	// ThresholdTokens: a response this long or longer goes to the lane.
	ThresholdTokens int `json:"threshold_tokens"`
	// LaneShare in (0, 1]: the share of a normal engine's planned work
	// the lane also takes.
	LaneShare float64 `json:"lane_share"`
}

// DefaultLane is the reference's shipped plan.
func DefaultLane() LaneSpec { return LaneSpec{ThresholdTokens: 9500, LaneShare: 0.3} }

// Validate reports a parameter outside its range.
func (s LaneSpec) Validate() error {
	if s.ThresholdTokens <= 0 {
		return fmt.Errorf("longest_lane: threshold_tokens must be positive, got %d", s.ThresholdTokens)
	}
	if !(s.LaneShare > 0 && s.LaneShare <= 1) {
		return fmt.Errorf("longest_lane: lane_share must be in (0, 1], got %v", s.LaneShare)
	}
	return nil
}

// promptWeight is what a prompt token counts in the plan's work against an
// output token: prefill runs batched, thousands of tokens a step, where a
// decode step makes one token per sequence.
const promptWeight = 0.1

// lanePlan places one step's requests by the plan; the plan restarts at
// every step (every request of a GRPO step is placed before its first
// finishes, so planned work is what each engine will run).
type lanePlan struct {
	spec  LaneSpec
	phase int
	work  []float64
}

func newLanePlan(spec LaneSpec, engines int) *lanePlan {
	return &lanePlan{spec: spec, phase: -1, work: make([]float64, engines)}
}

// pick returns the engine index for a request of the given phase, true
// response length and prompt length.
func (p *lanePlan) pick(phase, respTokens, promptTokens int) int {
	if phase != p.phase {
		p.phase = phase
		clear(p.work)
	}
	best := 0
	if respTokens < p.spec.ThresholdTokens {
		bv := math.Inf(1)
		for i, w := range p.work {
			if i == 0 {
				w /= p.spec.LaneShare
			}
			if w < bv {
				bv, best = w, i
			}
		}
	}
	p.work[best] += float64(respTokens) + promptWeight*float64(promptTokens)
	return best
}
