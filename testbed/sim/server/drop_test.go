package server

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/testbed/sim"
)

// POST /sim/drop_kv_events?next=N withholds exactly the next N batches
// numbered after the call from the live stream: none already numbered, none
// later; they stay replayable. The collector's gap end-to-end test relies on
// this: the batches of the completions sent after the hook returns are the
// ones lost.
func TestDropNextHook(t *testing.T) {
	s := startServer(t, Config{
		Engine:                 sim.Config{NumGPUBlocks: 64},
		KVEventsEndpoint:       "tcp://127.0.0.1:0",
		KVEventsReplayEndpoint: "tcp://127.0.0.1:0",
		KVEventsTopic:          "kv@drop",
	})
	live := subscribe(t, s.KVEventsEndpoints()[0])
	pub := s.Publisher(0)
	prompt := 0
	complete := func() {
		t.Helper()
		prompt++
		body := `{"prompt":` + idsJSON(1000*prompt, 40) + `,"max_tokens":2}`
		if code, b := post(t, s.URL()+"/v1/completions", body); code != 200 {
			t.Fatalf("%d %s", code, b)
		}
	}
	// Publish until the subscription has reached the PUB (slow joiner),
	// then drain what is in flight.
	joined := false
	for i := 0; i < 200 && !joined; i++ {
		complete()
		select {
		case <-live:
			joined = true
		case <-time.After(50 * time.Millisecond):
		}
	}
	if !joined {
		t.Fatal("subscription never received a batch")
	}
	s.FlushEvents()
	first := pub.NextSeq()
	for drained := false; !drained; {
		select {
		case m := <-live:
			if m.seq >= first {
				t.Fatalf("seq %d before any new batch", m.seq)
			}
		case <-time.After(200 * time.Millisecond):
			drained = true
		}
	}

	// Rejected requests change nothing (checked by the counts below).
	for _, bad := range []string{"next=-1", "next=x", "next=1&seq=y", "engine=3&next=1"} {
		if code, _ := post(t, s.URL()+"/sim/drop_kv_events?"+bad, ""); code != 400 {
			t.Fatalf("%s: status %d, want 400", bad, code)
		}
	}
	code, b := post(t, s.URL()+"/sim/drop_kv_events?next=2", "")
	if code != 200 {
		t.Fatalf("drop hook: %d %s", code, b)
	}
	var resp struct {
		NextSeq uint64 `json:"next_seq"`
		Dropped uint64 `json:"dropped"`
	}
	if err := json.Unmarshal(b, &resp); err != nil || resp.NextSeq != first || resp.Dropped != 0 {
		t.Fatalf("drop hook reply %s (%v), want next_seq %d dropped 0", b, err, first)
	}
	for i := 0; i < 4; i++ {
		complete()
	}
	s.FlushEvents()
	end := pub.NextSeq()
	if end < first+4 {
		t.Fatalf("4 completions made only %d batches", end-first)
	}
	// The PUB delivers in order on one connection: once the last batch is
	// here, the withheld ones would have arrived before it.
	got := map[uint64]bool{}
	deadline := time.After(10 * time.Second)
	for !got[end-1] {
		select {
		case m := <-live:
			got[m.seq] = true
		case <-deadline:
			t.Fatalf("live batches %v, want up to %d", got, end-1)
		}
	}
	for seq := first; seq < end; seq++ {
		if want := seq >= first+2; got[seq] != want {
			t.Fatalf("seq %d live=%v, want %v (dropped from %d, 2 of them)", seq, got[seq], want, first)
		}
	}
	if pub.Dropped() != 2 {
		t.Fatalf("dropped %d, want 2", pub.Dropped())
	}
	rep := replay(t, s.ReplayEndpoints()[0], first, 3, "kv@drop")
	if uint64(len(rep)) != end-first || rep[0].seq != first || rep[1].seq != first+1 {
		t.Fatalf("replay from %d gave %d batches", first, len(rep))
	}
}
