package load

import (
	"math"
	"testing"
)

// computeMath is Compute written with math.Min and math.Max, as it was
// before it used the min and max builtins.
func computeMath(m Metrics, fresh bool, inflight, capacity int) float64 {
	if capacity <= 0 {
		capacity = DefaultMaxNumSeqs
	}
	c := float64(capacity)
	in := float64(inflight)
	if !fresh {
		return 0.7*math.Min(1, in/c) + 0.3*math.Min(1, math.Max(0, in-c)/c)
	}
	// Negative and NaN counts count as 0 (Check refuses them in stored
	// metrics; Compute must still not turn them into a load).
	clamp := func(v float64) float64 {
		if math.IsNaN(v) || v < 0 {
			return 0
		}
		return v
	}
	running, waiting := clamp(m.Running), clamp(m.Waiting)
	queue := math.Max(running+waiting, in)
	over := math.Max(waiting, queue-c)
	kv := 0.0
	if m.HasKVUsage {
		kv = math.Min(1, clamp(m.KVUsage))
	}
	return 0.4*kv + 0.3*math.Min(1, queue/c) + 0.3*math.Min(1, math.Max(0, over)/c)
}

// The builtins must give bit-identical loads, NaN, infinities and signed
// zeros included (a scrape can report any float).
func TestComputeBuiltinsMatchMath(t *testing.T) {
	vals := []float64{math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1), 0, 0.3, 1, 1.5, -2, 7, 300, 1e9}
	for _, run := range vals {
		for _, wait := range vals {
			for _, kv := range vals {
				for _, fresh := range []bool{false, true} {
					for _, in := range []int{0, 3, 300} {
						for _, capacity := range []int{0, 1, 256} {
							m := Metrics{Running: run, Waiting: wait, KVUsage: kv, HasKVUsage: true}
							got, want := Compute(m, fresh, in, capacity), computeMath(m, fresh, in, capacity)
							if math.Float64bits(got) != math.Float64bits(want) && !(math.IsNaN(got) && math.IsNaN(want)) {
								t.Fatalf("%+v fresh=%v in=%d cap=%d: %v, math.Min/Max %v", m, fresh, in, capacity, got, want)
							}
							if !(got >= 0 && got <= 1) {
								t.Fatalf("%+v fresh=%v in=%d cap=%d: load %v outside [0, 1]", m, fresh, in, capacity, got)
							}
						}
					}
				}
			}
		}
	}
}
