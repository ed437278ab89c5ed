// Command kvctl is the operator's tool for kvc-router: decode captured KV
// events, scrape a server's /metrics as the router sees it, watch a live
// event stream, and compute block keys.
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

	"github.com/go-zeromq/zmq4"

	"github.com/kvc-router/kvc-router/core/blockhash"
	"github.com/kvc-router/kvc-router/core/collector"
	"github.com/kvc-router/kvc-router/core/kvevents"
	"github.com/kvc-router/kvc-router/core/metrics"
)

const usage = `kvctl: operator tool for kvc-router

Usage:
  kvctl decode-events FILE|-      decode one raw msgpack KVEventBatch, print one JSON object per event
  kvctl scrape URL                fetch and parse a /metrics endpoint, print the load snapshot as JSON
  kvctl watch ENDPOINT            subscribe to a KV-event publisher and print decoded events live
  kvctl keys --block-size N       read token ids (a JSON array) on stdin, print the block keys
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

// eventJSON is one event as kvctl prints it.
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
	TS              float64  `json:"ts"`
	DPRank          *int     `json:"dp_rank"`
}

func printBatch(w io.Writer, b *kvevents.Batch, seq *uint64) error {
	enc := json.NewEncoder(w)
	for i := range b.Events {
		ev := &b.Events[i]
		out := eventJSON{Seq: seq, Type: ev.TypeName, BlockHashes: ev.BlockHashes, TokenIDs: ev.TokenIDs,
			BlockSize: ev.BlockSize, TS: b.TS}
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
		if ev.Medium != "" {
			m := ev.Medium
			out.Medium = &m
		}
		if ev.LoraID >= 0 {
			l := ev.LoraID
			out.LoraID = &l
		}
		if ev.LoraName != "" {
			l := ev.LoraName
			out.LoraName = &l
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
	if len(pos) != 1 {
		fs.Usage()
		return errUsage
	}
	var r io.Reader = stdin
	if p := pos[0]; p != "-" {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, int64(*limit)+1))
	if err != nil {
		return err
	}
	if len(data) > *limit {
		return fmt.Errorf("payload larger than %d bytes", *limit)
	}
	b, err := kvevents.Decode(data)
	if err != nil {
		return err
	}
	return printBatch(stdout, b, nil)
}

func scrape(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("scrape", "scrape URL\n\nFetches a /metrics endpoint (e.g. http://127.0.0.1:8000/metrics) and prints what the router learns from it.", stderr)
	flavor := fs.String("flavor", "vllm", "engine metric names: vllm or sglang")
	timeout := fs.Duration("timeout", 5*time.Second, "request timeout")
	limit := fs.Int64("max-bytes", metrics.DefaultLimit, "response size limit")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return errUsage
	}
	var fl metrics.Flavor
	switch *flavor {
	case "vllm":
		fl = metrics.VLLM
	case "sglang":
		fl = metrics.SGLang
	default:
		return fmt.Errorf("--flavor %q (allowed: vllm, sglang)", *flavor)
	}
	url := pos[0]
	if !strings.Contains(url, "://") {
		url = collector.MetricsURL(url)
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
	m, err := metrics.Parse(resp.Body, fl, *limit)
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
	sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(10), zmq4.WithDialerRetry(200*time.Millisecond))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, *topic); err != nil {
		return err
	}
	if err := sub.Dial(pos[0]); err != nil {
		return err
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	var b kvevents.Batch
	var last uint64
	started, seen := false, 0
	emit := func(seq uint64, payload []byte) {
		if err := kvevents.DecodeInto(payload, &b); err != nil {
			fmt.Fprintf(stderr, "kvctl watch: seq %d: %v\n", seq, err)
			return
		}
		s := seq
		_ = printBatch(out, &b, &s)
		out.Flush()
	}
	for *count == 0 || seen < *count {
		m, err := sub.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
			fmt.Fprintf(stderr, "kvctl watch: ignoring a %d-frame message\n", len(m.Frames))
			continue
		}
		// Unsigned 64-bit, as vLLM sends them; a lower seq is a new run.
		seq := binary.BigEndian.Uint64(m.Frames[1])
		if *replay != "" && (!started || seq < last || seq-last > 1) {
			from := last + 1
			if !started || seq < last {
				from = 0
			}
			if from < seq {
				ok, _, err := collector.Replay(ctx, *replay, from, seq, 5*time.Second, time.Second, !started, emit)
				if !ok || err != nil {
					fmt.Fprintf(stderr, "kvctl watch: replay [%d, %d) incomplete: %v\n", from, seq, err)
				}
			}
		} else if started && seq != last+1 {
			fmt.Fprintf(stderr, "kvctl watch: sequence jumped from %d to %d\n", last, seq)
		}
		emit(seq, m.Frames[2])
		last, started = seq, true
		seen++
	}
	return nil
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
	bs := fs.Int("block-size", blockhash.DefaultBlockSize, "tokens per block")
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
	out := blockhash.Keys(ids, *bs, blockhash.Namespace(*model, *lora))
	if out == nil {
		out = []uint64{}
	}
	return json.NewEncoder(stdout).Encode(out)
}
