package collector

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/kvevents"
)

// A subscriber decodes with its configured limits, not only the payload
// size: a batch over MaxEvents is counted as a decode error, not applied;
// limits left zero take their defaults (a payload size limit of 0 must not
// reject everything).
func TestSubscriberDecodesWithItsLimits(t *testing.T) {
	r := newRouter(t, "s")
	s := NewSubscriber(r, "s", Endpoint{Endpoint: "tcp://127.0.0.1:1"}, SubscriberConfig{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Limits: kvevents.Limits{MaxEvents: 1},
	})
	two, err := kvevents.Encode(&kvevents.Batch{Events: []kvevents.Event{
		stored([]uint64{1}, nil, seq(16, 1), "GPU", ""), stored([]uint64{2}, nil, seq(16, 100), "GPU", ""),
	}}, kvevents.LayoutArray)
	if err != nil {
		t.Fatal(err)
	}
	s.handle(context.Background(), [][]byte{nil, binary.BigEndian.AppendUint64(nil, 0), two})
	if ev := s.Status().Events; ev.DecodeErrors != 1 || ev.StoredBlocks != 0 {
		t.Fatalf("2-event batch with MaxEvents 1: %+v", ev)
	}
	one, _ := kvevents.Encode(&kvevents.Batch{Events: []kvevents.Event{stored([]uint64{3}, nil, seq(16, 7), "GPU", "")}}, kvevents.LayoutArray)
	s.handle(context.Background(), [][]byte{nil, binary.BigEndian.AppendUint64(nil, 1), one})
	if ev := s.Status().Events; ev.DecodeErrors != 1 || ev.StoredBlocks != 1 {
		t.Fatalf("1-event batch: %+v", ev)
	}
}
