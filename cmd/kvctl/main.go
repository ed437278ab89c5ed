// Command kvctl is the operator's tool for kvc-router: decode captured KV
// events, scrape a server's /metrics as the router sees it, watch a live
// event stream, compute block keys, explain a routing decision, and check a
// configuration and the servers it names before a job starts (preflight).
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"github.com/vmihailenco/msgpack/v5"
)

const usage = `kvctl: operator tool for kvc-router

Usage:
  kvctl decode-events FILE|-      decode one raw msgpack KVEventBatch, print one JSON object per event
  kvctl scrape URL                fetch and parse a /metrics endpoint, print the load snapshot as JSON
  kvctl watch ENDPOINT            subscribe to a KV-event publisher and print decoded events live
  kvctl keys --block-size N       read token ids (a JSON array) on stdin, print the block keys
  kvctl explain FILE|-            print the last routing decision stage by stage from a status
                                  document (get_status() or kvr_status JSON, or its last_decision)
  kvctl explain --dry-run FILE|-  the same for the decision a scenario's request would get (config,
                                  servers' metrics, cached prompts, in-flight counts, sessions); nothing is routed
  kvctl preflight [--config FILE] [--server ID]...
                                  check a router configuration (verl's router: block or whole YAML)
                                  as the library does, probe each server's /metrics and KV-event
                                  publisher, and say what to do about what fails
  kvctl config-doc [--root DIR]   print the configuration reference (docs/configuration.md) from the
                                  Go model; DIR is the source checkout (default .)

Run 'kvctl COMMAND --help' for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes one command and returns the process exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	var err error
	switch args[0] {
	case "decode-events":
		err = decodeEvents(args[1:], stdin, stdout, stderr)
	case "scrape":
		err = scrape(ctx, args[1:], stdout, stderr)
	case "watch":
		err = watch(ctx, args[1:], stdout, stderr)
	case "keys":
		err = keys(args[1:], stdin, stdout, stderr)
	case "config-doc":
		err = configDoc(args[1:], stdout, stderr)
	case "explain":
		err = explain(args[1:], stdin, stdout, stderr)
	case "preflight":
		err = preflight(ctx, args[1:], stdin, stdout, stderr)
	default:
		err = fmt.Errorf("unknown command %q\n\n%s", args[0], usage)
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "kvctl %s: %v\n", args[0], err)
		return 1
	}
}

var errUsage = errors.New("usage")

func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: kvctl %s\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// eventJSON is one event as kvctl prints it: every field of vLLM's
// BlockStored / BlockRemoved (null when absent), plus what the decoder
// concluded (bigram token pairs, a dropped event's reason).
type eventJSON struct {
	Seq             *uint64  `json:"seq,omitempty"`
	Type            string   `json:"type"`
	BlockHashes     []uint64 `json:"block_hashes"`
	ParentBlockHash *uint64  `json:"parent_block_hash"`
	TokenIDs        []int32  `json:"token_ids"`
	BlockSize       int      `json:"block_size"`
	Medium          *string  `json:"medium"`
	LoraID          *int64   `json:"lora_id"`
	LoraName        *string  `json:"lora_name"`
	ExtraKeys       any      `json:"extra_keys"`
	GroupIdx        *int     `json:"group_idx"`
	KVCacheSpecKind *string  `json:"kv_cache_spec_kind"`
	SlidingWindow   *int     `json:"kv_cache_spec_sliding_window"`
	BigramTokens    bool     `json:"bigram_token_ids,omitempty"`
	Dropped         string   `json:"dropped,omitempty"`
	DropError       string   `json:"drop_error,omitempty"`
	TS              float64  `json:"ts"`
	DPRank          *int     `json:"dp_rank"`
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func printBatch(w io.Writer, b *kvcrouter.EventBatch, seq *uint64) error {
	enc := json.NewEncoder(w)
	for i := range b.Events {
		ev := &b.Events[i]
		out := eventJSON{Seq: seq, Type: ev.TypeName, BlockHashes: ev.BlockHashes, TokenIDs: ev.TokenIDs,
			BlockSize: ev.BlockSize, TS: b.TS, Medium: strPtr(ev.Medium), LoraName: strPtr(ev.LoraName),
			KVCacheSpecKind: strPtr(ev.KVCacheSpecKind), BigramTokens: ev.Bigram}
		if out.Type == "" {
			out.Type = ev.Kind.String()
		}
		if out.BlockHashes == nil {
			out.BlockHashes = []uint64{}
		}
		if out.TokenIDs == nil {
			out.TokenIDs = []int32{}
		}
		if ev.HasParent {
			p := ev.ParentBlockHash
			out.ParentBlockHash = &p
		}
		if ev.LoraID >= 0 {
			l := ev.LoraID
			out.LoraID = &l
		}
		if ev.GroupIdx >= 0 {
			g := ev.GroupIdx
			out.GroupIdx = &g
		}
		if ev.HasSlidingWindow {
			sw := ev.SlidingWindow
			out.SlidingWindow = &sw
		}
		if len(ev.ExtraKeys) > 0 {
			// Raw msgpack as the engine sent it (a list, one entry per block).
			var v any
			if err := msgpack.Unmarshal(ev.ExtraKeys, &v); err == nil {
				out.ExtraKeys = v
			}
		}
		if ev.Drop != kvcrouter.EventDropNone {
			out.Dropped = ev.Drop.String()
			if ev.DropErr != nil {
				out.DropError = ev.DropErr.Error()
			}
		}
		if b.DPRank >= 0 {
			d := b.DPRank
			out.DPRank = &d
		}
		if err := enc.Encode(out); err != nil {
			return err
		}
	}
	return nil
}

func decodeEvents(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("decode-events", "decode-events FILE|-\n\nDecodes one raw msgpack KVEventBatch (a ZMQ payload frame).", stderr)
	limit := fs.Int("max-bytes", 64<<20, "reject payloads larger than this")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	data, err := readInput(fs, pos, stdin, *limit, "payload")
	if err != nil {
		return err
	}
	b, err := kvcrouter.DecodeEvents(data)
	if err != nil {
		return err
	}
	return printBatch(stdout, b, nil)
}

func scrape(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("scrape", "scrape URL\n\nFetches a /metrics endpoint (e.g. http://127.0.0.1:8000/metrics) and prints what the router learns from it.", stderr)
	flavor := fs.String("flavor", "vllm", "engine metric names: vllm or sglang")
	timeout := fs.Duration("timeout", 5*time.Second, "request timeout")
	limit := fs.Int64("max-bytes", kvcrouter.DefaultMetricsLimit, "response size limit")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return errUsage
	}
	var fl kvcrouter.MetricsFlavor
	switch *flavor {
	case "vllm":
		fl = kvcrouter.MetricsVLLM
	case "sglang":
		fl = kvcrouter.MetricsSGLang
	default:
		return fmt.Errorf("--flavor %q (allowed: vllm, sglang)", *flavor)
	}
	url := pos[0]
	if !strings.Contains(url, "://") {
		url = kvcrouter.MetricsURL(url)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", url, resp.Status)
	}
	m, err := kvcrouter.ParseMetrics(resp.Body, fl, *limit)
	if err != nil {
		return err
	}
	out := map[string]any{
		"url": url, "running": m.Running, "waiting": m.Waiting, "engines": m.Engines,
		"kv_cache_usage": nil, "prefix_cache_queries": m.PrefixQueries, "prefix_cache_hits": m.PrefixHits,
		"external_prefix_cache_queries": m.ExternalPrefixQueries, "external_prefix_cache_hits": m.ExternalPrefixHits,
		"block_size": m.BlockSize, "num_gpu_blocks": m.NumGPUBlocks, "max_num_seqs": m.MaxNumSeqs,
		"prefix_hit_rate": nil,
	}
	if m.HasKVUsage {
		out["kv_cache_usage"] = m.KVUsage
	}
	if m.PrefixQueries > 0 {
		out["prefix_hit_rate"] = m.PrefixHits / m.PrefixQueries
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func watch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("watch", "watch ENDPOINT [--replay ENDPOINT] [--topic T]\n\nSubscribes to a KV-event publisher (e.g. tcp://127.0.0.1:5557) and prints one JSON line per event, with its batch's seq.", stderr)
	replay := fs.String("replay", "", "replay endpoint; with it, gaps and the history before the first message are fetched")
	topic := fs.String("topic", "", "topic prefix filter")
	count := fs.Int("count", 0, "exit after this many batches (0 = until interrupted)")
	duration := fs.Duration("duration", 0, "exit after this long (0 = until interrupted)")
	maxPayload := fs.Int("max-payload-bytes", kvcrouter.DefaultMaxEventPayloadBytes,
		"largest batch accepted; a larger frame drops the connection (counted on stderr) before it is read")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return errUsage
	}
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	live := &watchConn{endpoint: pos[0], topic: *topic, maxPayload: *maxPayload, stderr: stderr}
	defer live.close()
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	var b kvcrouter.EventBatch
	var last uint64
	started, seen := false, 0
	emit := func(seq uint64, payload []byte) {
		if err := kvcrouter.DecodeEventsInto(payload, &b); err != nil {
			fmt.Fprintf(stderr, "kvctl watch: seq %d: %v\n", seq, err)
			return
		}
		s := seq
		_ = printBatch(out, &b, &s)
		out.Flush()
	}
	for *count == 0 || seen < *count {
		frames, err := live.recv(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if len(frames) != 3 || len(frames[1]) != 8 {
			fmt.Fprintf(stderr, "kvctl watch: ignoring a %d-frame message\n", len(frames))
			continue
		}
		// Unsigned 64-bit, as vLLM sends them; a lower seq is a new run.
		seq := binary.BigEndian.Uint64(frames[1])
		if *replay != "" && (!started || seq < last || seq-last > 1) {
			from := last + 1
			if !started || seq < last {
				from = 0
			}
			if from < seq {
				ok, _, err := kvcrouter.ReplayEventsWith(ctx, *replay, from, seq, kvcrouter.EventReplayOptions{Timeout: 5 * time.Second,
					DialTimeout: time.Second, Partial: !started, MaxPayloadBytes: *maxPayload}, emit)
				if !ok || err != nil {
					fmt.Fprintf(stderr, "kvctl watch: replay [%d, %d) incomplete: %v\n", from, seq, err)
				}
			}
		} else if started && seq != last+1 {
			fmt.Fprintf(stderr, "kvctl watch: sequence jumped from %d to %d\n", last, seq)
		}
		emit(seq, frames[2])
		last, started = seq, true
		seen++
	}
	return nil
}

// watchConn is kvctl watch's subscription: it dials on first use and
// after a dropped connection, with a backoff that ends with ctx (200 ms
// doubling to 3.2 s; 10 failures in a row give up).
type watchConn struct {
	endpoint, topic string
	maxPayload      int
	stderr          io.Writer
	c               *kvcrouter.LiveEvents
	dropped         int
}

func (w *watchConn) recv(ctx context.Context) ([][]byte, error) {
	fails := 0
	for {
		if w.c == nil {
			c, err := kvcrouter.DialLiveEvents(ctx, w.endpoint, w.topic, w.maxPayload, time.Second)
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				if fails++; fails >= 10 {
					return nil, err
				}
				if !sleep(ctx, 200*time.Millisecond<<min(fails-1, 4)) {
					return nil, ctx.Err()
				}
				continue
			}
			w.c = c
		}
		frames, err := w.c.Recv()
		if err == nil {
			return frames, nil
		}
		w.close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if kvcrouter.IsHostileEventPeer(err) {
			w.dropped++
			fmt.Fprintf(w.stderr, "kvctl watch: connection dropped (%d so far): %v\n", w.dropped, err)
		} else {
			fmt.Fprintf(w.stderr, "kvctl watch: connection lost: %v; reconnecting\n", err)
		}
		if fails++; fails >= 10 {
			return nil, err
		}
		if !sleep(ctx, 200*time.Millisecond<<min(fails-1, 4)) {
			return nil, ctx.Err()
		}
	}
}

func (w *watchConn) close() {
	if w.c != nil {
		w.c.Close()
		w.c = nil
	}
}

// sleep waits d unless ctx ends first; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// parse parses flags that may stand before or after positional arguments
// ("watch tcp://x --topic t" as well as "watch --topic t tcp://x").
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func keys(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("keys", "keys --block-size N [--model M] [--lora L]\n\nReads token ids as a JSON array on stdin and prints the router's block keys (one per full block) as a JSON array.", stderr)
	bs := fs.Int("block-size", kvcrouter.DefaultBlockSize, "tokens per block")
	model := fs.String("model", "", "model name (part of the key namespace; must match the router's config)")
	lora := fs.String("lora", "", "LoRA adapter name (part of the key namespace)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *bs <= 0 {
		return fmt.Errorf("--block-size must be positive, got %d", *bs)
	}
	var toks []int64
	dec := json.NewDecoder(io.LimitReader(stdin, 256<<20))
	if err := dec.Decode(&toks); err != nil {
		return fmt.Errorf("stdin must be a JSON array of token ids: %v", err)
	}
	ids := make([]int32, len(toks))
	for i, t := range toks {
		if t < -1<<31 || t > 1<<31-1 {
			return fmt.Errorf("token %d at position %d does not fit in int32", t, i)
		}
		ids[i] = int32(t)
	}
	out := kvcrouter.BlockKeys(ids, *bs, kvcrouter.HashNamespace(*model, *lora))
	if out == nil {
		out = []uint64{}
	}
	return json.NewEncoder(stdout).Encode(out)
}

// readInput reads the one positional FILE (or - for stdin), refusing more
// than limit bytes without reading past limit+1: kvctl's commands take
// documents an operator copied from anywhere.
func readInput(fs *flag.FlagSet, pos []string, stdin io.Reader, limit int, what string) ([]byte, error) {
	if len(pos) != 1 {
		fs.Usage()
		return nil, errUsage
	}
	var r io.Reader = stdin
	if p := pos[0]; p != "-" {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > limit {
		return nil, fmt.Errorf("%s larger than %d bytes", what, limit)
	}
	return data, nil
}
