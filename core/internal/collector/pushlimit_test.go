package collector

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/kvevents"
	"github.com/kvc-router/kvc-router/core/internal/metrics"
)

// The push paths take bodies already in memory whose size the caller bounds
// (the C ABI's push.max_metrics_bytes / max_event_bytes): a limit configured
// above the parsers' defaults must not be cut back to those defaults.
func TestPushPathsHonourCallerLimits(t *testing.T) {
	r := newRouter(t, "s")
	text := append(bytes.Repeat([]byte("# padding padding padding padding\n"), (metrics.DefaultLimit/34)+1),
		[]byte(fmt.Sprintf(vllmText, 2))...)
	if len(text) <= metrics.DefaultLimit {
		t.Fatal("body not above the default limit")
	}
	if err := PushMetrics(r, "s", text, metrics.VLLM); err != nil {
		t.Fatalf("%d-byte metrics body: %v", len(text), err)
	}
	ev := stored([]uint64{1}, nil, seq(16, 1), "GPU", string(bytes.Repeat([]byte("x"), kvevents.DefaultLimits.MaxPayloadBytes)))
	p, err := kvevents.Encode(&kvevents.Batch{Events: []kvevents.Event{ev}}, kvevents.LayoutArray)
	if err != nil {
		t.Fatal(err)
	}
	var st EventStats
	if err := ApplyPayload(r, "s", p, &st); err != nil || st.StoredBlocks.Load() != 1 {
		t.Fatalf("%d-byte payload: %v %+v", len(p), err, st.Snapshot())
	}
}
