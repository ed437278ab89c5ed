package collector

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/kvevents"
)

// FuzzCollectorConfig feeds arbitrary JSON to ParseConfig. Accepted configs
// must satisfy every rule validate promises (no negative durations or
// sizes, known names, dialable endpoints, http(s) URLs); nothing is started,
// so no input can make the test dial anywhere.
func FuzzCollectorConfig(f *testing.F) {
	for _, s := range []string{
		``, `null`, `{}`, `{"collectors":[]}`,
		`{"collectors":[{"name":"vllm_metrics","interval_ms":50,"timeout_ms":200,"max_bytes":65536,"urls":{"a":"http://127.0.0.1:1/metrics"}}]}`,
		`{"collectors":[{"name":"vllm_zmq","endpoints":{"a":[{"endpoint":"tcp://127.0.0.1:5557","replay":"tcp://127.0.0.1:5558","topic":"t"}]},"max_payload_bytes":1024}]}`,
		`{"collectors":[{"name":"sglang_metrics"},{"name":"vllm_polling"}]}`,
		`{"collectors":[{"name":"os.system"}]}`, `{"collectors":[{"name":"vllm_metrics","interval_ms":-1}]}`,
		`{"collectors":[{"name":"vllm_metrics","urls":{"a":"file:///etc/passwd"}}]}`,
		`{"collectors":[{"name":"vllm_zmq","endpoints":{"a":[{"endpoint":"udp://x:1"}]}}]}`,
		`{"collectors":[{"name":"vllm_zmq","endpoints":{"a":[{"endpoint":"tcp://x"}]}}]}`,
		`{"collectors":[{"name":"vllm_metrics","bogus":1}]}`, `{"collectors":{}}`, "\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("error does not wrap ErrConfig: %v", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted config fails validate: %v", err)
		}
		for _, s := range c.Collectors {
			switch s.Name {
			case NameVLLMMetrics, NameVLLMPolling, NameSGLangMetrics, NameVLLMZMQ, "test_push_once":
			default:
				t.Fatalf("accepted collector %q", s.Name)
			}
			if s.IntervalMS < 0 || s.TimeoutMS < 0 || s.MaxBytes < 0 || s.BackoffMaxMS < 0 || s.ReplayTimeoutMS < 0 ||
				s.IdleRedialMS < 0 || s.RetryMS < 0 || s.MaxPayloadBytes < 0 {
				t.Fatalf("accepted a negative setting: %+v", s)
			}
			for _, eps := range s.Endpoints {
				for _, ep := range eps {
					if checkEndpoint(ep.Endpoint) != nil {
						t.Fatalf("accepted endpoint %q", ep.Endpoint)
					}
				}
			}
		}
	})
}

// splitFrames cuts fuzz input into ZMQ frames: each frame is a length byte
// and that many bytes.
func splitFrames(data []byte) [][]byte {
	var frames [][]byte
	for len(data) > 0 && len(frames) < 8 {
		n := min(int(data[0]), len(data)-1)
		frames = append(frames, data[1:1+n])
		data = data[1+n:]
	}
	return frames
}

// FuzzReplayFrames checks parseReplay on arbitrary multipart replies: an
// accepted reply names its seq from an 8-byte frame and its payload is the
// last frame; anything else is rejected, never misread.
func FuzzReplayFrames(f *testing.F) {
	seqFrame := func(s uint64) []byte { return binary.BigEndian.AppendUint64(nil, s) }
	join := func(frames ...[]byte) []byte {
		var out []byte
		for _, fr := range frames {
			out = append(out, byte(len(fr)))
			out = append(out, fr...)
		}
		return out
	}
	f.Add(join(seqFrame(7), []byte("payload")))
	f.Add(join([]byte("topic"), seqFrame(7), []byte("payload")))
	f.Add(join([]byte{}, []byte("topic"), seqFrame(7), []byte("payload")))
	f.Add(join([]byte{}, seqFrame(7), []byte("payload")))
	f.Add(join(seqFrame(^uint64(0)), []byte{}))
	f.Add(join([]byte("topic"), seqFrame(^uint64(0)), []byte{}))
	f.Add(join([]byte("x"), []byte("shortseq"), []byte("p"), []byte("q")))
	f.Add(join(seqFrame(1)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := splitFrames(data)
		seq, payload, ok := parseReplay(frames)
		if !ok {
			if seq != 0 || payload != nil {
				t.Fatalf("rejected reply returned seq %d payload %q", seq, payload)
			}
			return
		}
		fr := frames
		if len(fr) == 4 && len(fr[0]) == 0 {
			fr = fr[1:]
		}
		if len(fr) != 2 && len(fr) != 3 {
			t.Fatalf("accepted a %d-frame reply", len(frames))
		}
		sf := fr[len(fr)-2]
		if len(sf) != 8 || binary.BigEndian.Uint64(sf) != seq {
			t.Fatalf("seq %d not read from the seq frame %x", seq, sf)
		}
		if !bytes.Equal(payload, fr[len(fr)-1]) {
			t.Fatalf("payload is not the last frame")
		}
	})
}

// FuzzLiveFrames feeds arbitrary live messages ([topic, seq, payload],
// malformed shapes, arbitrary seqs and payloads) to a subscriber without a
// replay endpoint, so no input dials anything. Whatever arrives, the
// subscriber never panics, counts what it rejects, and the index stays in
// its budget.
func FuzzLiveFrames(f *testing.F) {
	ok1, _ := kvevents.Encode(&kvevents.Batch{TS: 1, Events: []kvevents.Event{stored([]uint64{1, 2}, nil, seq(32, 1), "GPU", "")}}, kvevents.LayoutArray)
	ok2, _ := kvevents.Encode(&kvevents.Batch{TS: 2, Events: []kvevents.Event{{Kind: kvevents.KindCleared, TypeName: "AllBlocksCleared"}}}, kvevents.LayoutMap)
	msg := func(s uint64, payload []byte) []byte {
		out := []byte{1, 't', 8}
		out = binary.BigEndian.AppendUint64(out, s)
		out = append(out, byte(len(payload)))
		return append(out, payload...)
	}
	f.Add(msg(0, ok1))
	f.Add(append(msg(0, ok1), msg(5, ok2)...))
	f.Add(append(msg(3, ok1), msg(1, ok1)...))
	f.Add(append(msg(0, ok1), msg(0, ok1)...))
	f.Add(msg(^uint64(0), []byte{0xc1}))
	f.Add([]byte{2, 'x', 'y'})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := newRouter(t, "s")
		logger := slog.New(slog.NewTextHandler(io.Discard, nil))
		s := NewSubscriber(r, "s", Endpoint{Endpoint: "tcp://127.0.0.1:1"},
			SubscriberConfig{Logger: logger, Limits: kvevents.Limits{MaxPayloadBytes: 200, MaxEvents: 16, MaxHashesPerEvent: 64, MaxTokensPerEvent: 1024}})
		ctx := context.Background()
		// Each message: a frame count (1..4) and that many frames.
		for len(data) > 0 {
			n := int(data[0]%4) + 1
			frames := splitFrames(data[1:])
			if len(frames) > n {
				frames = frames[:n]
			}
			used := 1
			for _, fr := range frames {
				used += 1 + len(fr)
			}
			data = data[min(used, len(data)):]
			s.handle(ctx, frames)
		}
		st := s.Status()
		if st.Replays != 0 {
			t.Fatalf("replayed without a replay endpoint: %+v", st)
		}
		if ix := r.Status().Index; ix.Entries > ix.MaxEntries {
			t.Fatalf("index over budget: %+v", ix)
		}
	})
}
