package router

import "time"

// LatencyBounds are the upper bounds, in seconds, of the decision-latency
// histogram's buckets (the last bucket, +Inf, is implicit). A decision is
// a few microseconds; the upper buckets catch pathological prompts.
var LatencyBounds = [...]float64{1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 5e-3, 2.5e-2, 0.1}

var latencyBoundsNs = func() (ns [len(LatencyBounds)]int64) {
	for i, b := range LatencyBounds {
		ns[i] = int64(b*1e9 + 0.5)
	}
	return ns
}()

// latencyHist counts decision durations per bucket (acquireLocked: the
// decision itself, without the wait for the router's lock). It is updated under the
// router's lock, so plain integers suffice; the status copies it. A fixed
// histogram (rather than per-decision samples) lets an exporter publish
// latency from a periodic status snapshot at no per-decision cost beyond
// two clock reads.
type latencyHist struct {
	counts [len(LatencyBounds) + 1]uint64
	sumNs  uint64
}

func (h *latencyHist) observe(d time.Duration) {
	ns := int64(d)
	i := 0
	for i < len(latencyBoundsNs) && ns > latencyBoundsNs[i] {
		i++
	}
	h.counts[i]++
	if ns > 0 {
		h.sumNs += uint64(ns)
	}
}

// LatencyStatus is the histogram in Prometheus' shape: Buckets[i] counts
// the decisions that took at most Bounds[i] seconds (cumulative), Count
// all of them (the +Inf bucket), Sum their total duration in seconds.
type LatencyStatus struct {
	Bounds  []float64 `json:"le"`
	Buckets []uint64  `json:"buckets"`
	Count   uint64    `json:"count"`
	Sum     float64   `json:"sum"`
}

func (h *latencyHist) status() LatencyStatus {
	st := LatencyStatus{Bounds: LatencyBounds[:], Buckets: make([]uint64, len(LatencyBounds))}
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if i < len(st.Buckets) {
			st.Buckets[i] = cum
		}
	}
	st.Count = cum
	st.Sum = float64(h.sumNs) / 1e9
	return st
}
