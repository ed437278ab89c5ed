package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvc-router/kvc-router/testbed/sim"
)

type liveMsg struct {
	topic   string
	seq     uint64
	payload []byte
}

// subscribe dials a SUB socket and forwards messages to a channel.
func subscribe(t *testing.T, ep string) <-chan liveMsg {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx)
	if err := sub.Dial(ep); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	ch := make(chan liveMsg, 10000)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
				t.Errorf("live frames %d", len(m.Frames))
				continue
			}
			ch <- liveMsg{string(m.Frames[0]), binary.BigEndian.Uint64(m.Frames[1]), m.Frames[2]}
		}
	}()
	t.Cleanup(func() { cancel(); sub.Close(); wg.Wait() })
	return ch
}

// replay asks the ROUTER for every batch from start; it parses both reply
// layouts and checks the one expected.
func replay(t *testing.T, ep string, start uint64, layout int, topic string) []liveMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity(fmt.Sprint("dealer-", start, "-", layout))))
	defer d.Close()
	if err := d.Dial(ep); err != nil {
		t.Fatal(err)
	}
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, seqBytes(start))); err != nil {
		t.Fatal(err)
	}
	var out []liveMsg
	for {
		m, err := d.Recv()
		if err != nil {
			t.Fatalf("replay recv: %v", err)
		}
		f := m.Frames
		if len(f) == 0 || len(f[0]) != 0 {
			t.Fatalf("reply without empty delimiter: %q", f)
		}
		f = f[1:]
		var lm liveMsg
		switch len(f) {
		case 3:
			if layout != 3 {
				t.Fatalf("3-frame reply with layout %d", layout)
			}
			lm = liveMsg{string(f[0]), binary.BigEndian.Uint64(f[1]), f[2]}
		case 2:
			if layout != 2 {
				t.Fatalf("2-frame reply with layout %d", layout)
			}
			lm = liveMsg{topic, binary.BigEndian.Uint64(f[0]), f[1]}
		default:
			t.Fatalf("reply with %d frames", len(f))
		}
		if lm.seq == EndSeq {
			if len(lm.payload) != 0 || lm.topic != topic && layout == 3 && lm.topic != "" {
				t.Fatalf("bad end marker %+v", lm)
			}
			return out
		}
		out = append(out, lm)
	}
}

func TestKVEventsZMQ(t *testing.T) {
	tests := []struct {
		name         string
		layout       kvcrouter.EventLayout
		replayLayout int
	}{
		{"array layout, replay v3", kvcrouter.EventLayoutArray, 3},
		{"map layout, replay v2", kvcrouter.EventLayoutMap, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const topic = "kv@127.0.0.1@test/model"
			s := startServer(t, Config{
				Engine:                 sim.Config{NumGPUBlocks: 8, CPUBlocks: 4},
				KVEventsEndpoint:       "tcp://127.0.0.1:0",
				KVEventsReplayEndpoint: "tcp://127.0.0.1:0",
				KVEventsTopic:          topic,
				KVEventsLayout:         tc.layout,
				KVEventsReplayLayout:   tc.replayLayout,
			})
			live := subscribe(t, s.KVEventsEndpoints()[0])
			time.Sleep(300 * time.Millisecond) // let the subscription reach the PUB
			pub := s.Publisher(0)
			// Withhold batch 2 from the live stream to force a gap.
			pub.DropSeqs(2)
			for i := 0; i < 8; i++ {
				body := `{"prompt":` + idsJSON(1000*(i%3)+1, 40+i) + `,"max_tokens":20}`
				if code, b := post(t, s.URL()+"/v1/completions", body); code != 200 {
					t.Fatalf("%d %s", code, b)
				}
			}
			if code, _ := post(t, s.URL()+"/reset_prefix_cache", ""); code != 200 {
				t.Fatal("reset failed")
			}
			s.FlushEvents()
			total := pub.NextSeq()
			if total < 5 {
				t.Fatalf("only %d batches", total)
			}
			got := map[uint64]liveMsg{}
			deadline := time.After(10 * time.Second)
			for uint64(len(got)) < total-1 {
				select {
				case m := <-live:
					if m.topic != topic {
						t.Fatalf("topic %q", m.topic)
					}
					got[m.seq] = m
				case <-deadline:
					t.Fatalf("received %d of %d live batches", len(got), total-1)
				}
			}
			if _, ok := got[2]; ok {
				t.Fatal("dropped batch 2 arrived live")
			}
			if pub.Dropped() != 1 {
				t.Fatalf("dropped %d", pub.Dropped())
			}
			// Replay from the gap returns every batch from 2, byte-identical.
			rep := replay(t, s.ReplayEndpoints()[0], 2, tc.replayLayout, topic)
			if uint64(len(rep)) != total-2 {
				t.Fatalf("replayed %d batches want %d", len(rep), total-2)
			}
			for i, m := range rep {
				if m.seq != uint64(i)+2 {
					t.Fatalf("replay seq %d at %d", m.seq, i)
				}
				if l, ok := got[m.seq]; ok && string(l.payload) != string(m.payload) {
					t.Fatalf("replayed payload %d differs", m.seq)
				}
			}
			got[2] = rep[0]
			// Replay from beyond the end: only the end marker.
			if r := replay(t, s.ReplayEndpoints()[0], total+5, tc.replayLayout, topic); len(r) != 0 {
				t.Fatalf("replay beyond end gave %d", len(r))
			}
			// Decode all batches in order; applying them ends empty (reset last)
			// and, before the reset, matches the engine's truth.
			ledger := map[sim.CachedBlock]int{}
			sawCPU, sawMap := false, false
			for seq := uint64(0); seq < total; seq++ {
				b, err := kvcrouter.DecodeEvents(got[seq].payload)
				if err != nil {
					t.Fatalf("decode %d: %v", seq, err)
				}
				if b.DPRank != 0 || b.TS < 1e9 {
					t.Fatalf("batch %d rank %d ts %g", seq, b.DPRank, b.TS)
				}
				for _, ev := range b.Events {
					med := ev.Medium
					switch ev.Kind {
					case kvcrouter.EventStored:
						if med == "CPU" {
							sawCPU = true
						}
						if ev.KVCacheSpecKind == "full_attention" {
							sawMap = true
						}
						if med == "GPU" && len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
							t.Fatalf("stored event tokens %d for %d blocks", len(ev.TokenIDs), len(ev.BlockHashes))
						}
						for _, h := range ev.BlockHashes {
							ledger[sim.CachedBlock{Hash: h, Medium: med}]++
						}
					case kvcrouter.EventRemoved:
						for _, h := range ev.BlockHashes {
							k := sim.CachedBlock{Hash: h, Medium: med}
							if ledger[k]--; ledger[k] == 0 {
								delete(ledger, k)
							}
						}
					case kvcrouter.EventCleared:
						if seq != total-1 {
							t.Fatalf("clear at %d", seq)
						}
						clear(ledger)
					}
				}
			}
			if !sawCPU {
				t.Fatal("no CPU offload events")
			}
			if sawMap != (tc.layout == kvcrouter.EventLayoutMap) {
				t.Fatalf("map fields present=%v", sawMap)
			}
			if len(ledger) != 0 {
				t.Fatalf("ledger not empty after reset: %d", len(ledger))
			}
		})
	}
}

// TestKVEventsMatchEngine checks that the live stream reproduces the
// engine's resident set (no reset) with DropEvery forcing periodic gaps
// that are filled by replay.
func TestKVEventsMatchEngine(t *testing.T) {
	s := startServer(t, Config{
		Engine:                 sim.Config{NumGPUBlocks: 40, CPUBlocks: 10, SSDBlocks: 10, BlockSize: 8},
		KVEventsEndpoint:       "tcp://127.0.0.1:0",
		KVEventsReplayEndpoint: "tcp://127.0.0.1:0",
		KVEventsDropEvery:      3,
	})
	live := subscribe(t, s.KVEventsEndpoints()[0])
	time.Sleep(300 * time.Millisecond)
	var wg sync.WaitGroup
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := `{"prompt":` + idsJSON(500*(i%4)+1, 30+3*i) + `,"max_tokens":12}`
			if code, b := post(t, s.URL()+"/v1/completions", body); code != 200 {
				t.Errorf("%d %s", code, b)
			}
		}()
	}
	wg.Wait()
	s.FlushEvents()
	total := s.Publisher(0).NextSeq()
	want := total - total/3
	got := map[uint64][]byte{}
	deadline := time.After(10 * time.Second)
	for uint64(len(got)) < want {
		select {
		case m := <-live:
			if m.seq%3 == 2 {
				t.Fatalf("seq %d should have been dropped", m.seq)
			}
			got[m.seq] = m.payload
		case <-deadline:
			t.Fatalf("live %d of %d", len(got), want)
		}
	}
	for _, m := range replay(t, s.ReplayEndpoints()[0], 0, 3, "") {
		if p, ok := got[m.seq]; ok && string(p) != string(m.payload) {
			t.Fatal("replay differs from live")
		}
		got[m.seq] = m.payload
	}
	ledger := map[sim.CachedBlock]int{}
	for seq := uint64(0); seq < total; seq++ {
		b, err := kvcrouter.DecodeEvents(got[seq])
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			for _, h := range ev.BlockHashes {
				k := sim.CachedBlock{Hash: h, Medium: ev.Medium}
				if ev.Kind == kvcrouter.EventStored {
					ledger[k]++
				} else if ledger[k]--; ledger[k] == 0 {
					delete(ledger, k)
				}
			}
		}
	}
	var truth map[sim.CachedBlock]int
	if err := s.Do(0, func(e *sim.Engine) { truth = e.CachedBlocks() }); err != nil {
		t.Fatal(err)
	}
	if len(truth) == 0 || fmt.Sprint(truth) != fmt.Sprint(ledger) {
		t.Fatalf("events give %d blocks, engine %d", len(ledger), len(truth))
	}
}
