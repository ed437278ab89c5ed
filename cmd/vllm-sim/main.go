// Command vllm-sim serves simulated vLLM engines (testbed/sim) with vLLM's HTTP
// API, Prometheus metrics and ZMQ KV-cache events. It runs one server, or a
// fleet of N servers on consecutive ports (--fleet N --base-port P), and
// prints one JSON line per server on stdout:
//
//	{"index":0,"url":"http://127.0.0.1:8000","port":8000,"model":"...",
//	 "kv_events_endpoints":["tcp://127.0.0.1:5557"],
//	 "kv_events_replay_endpoints":["tcp://127.0.0.1:5558"],"topic":"...",
//	 "data_parallel_size":1,"block_size":16,"num_gpu_blocks":8192}
//
// Event ports in fleet mode (--base-event-port E, data-parallel size D):
// server i publishes on E+2·i·D (+rank) and replays on E+2·i·D+D (+rank);
// with D=1 that is E+2i and E+2i+1.
package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvc-router/kvc-router/testbed/sim"
	"github.com/kvc-router/kvc-router/testbed/sim/server"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "vllm-sim:", err)
		}
		os.Exit(1)
	}
}

// ServerInfo is the JSON line printed per server.
type ServerInfo struct {
	Index            int      `json:"index"`
	URL              string   `json:"url"`
	Port             int      `json:"port"`
	Model            string   `json:"model"`
	KVEvents         []string `json:"kv_events_endpoints"`
	KVEventsReplay   []string `json:"kv_events_replay_endpoints"`
	Topic            string   `json:"topic"`
	DataParallelSize int      `json:"data_parallel_size"`
	BlockSize        int      `json:"block_size"`
	NumGPUBlocks     int      `json:"num_gpu_blocks"`
}

type options struct {
	host, model               string
	port, basePort, fleet, dp int
	ec                        sim.Config
	hashSeed                  string
	speed                     float64
	clock                     string
	eventsEP, replayEP, topic string
	encoding                  string
	bufferSteps, replayLayout int
	dropEvery, baseEventPort  int
	hashAlgo, logLevel        string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("vllm-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.host, "host", "127.0.0.1", "HTTP (and derived ZMQ) host")
	fs.IntVar(&o.port, "port", 8000, "HTTP port (0 = any; single server)")
	fs.StringVar(&o.model, "model", sim.DefaultModelName, "served model name")
	fs.IntVar(&o.ec.BlockSize, "block-size", sim.DefaultBlockSize, "tokens per KV block")
	fs.IntVar(&o.ec.NumGPUBlocks, "num-gpu-blocks", sim.DefaultNumGPUBlocks, "GPU KV blocks per engine")
	fs.IntVar(&o.ec.CPUBlocks, "cpu-blocks", 0, "CPU offload tier blocks (0 = off)")
	fs.IntVar(&o.ec.SSDBlocks, "ssd-blocks", 0, "SSD offload tier blocks (0 = off)")
	fs.IntVar(&o.ec.MaxNumSeqs, "max-num-seqs", sim.DefaultMaxNumSeqs, "max running requests")
	fs.IntVar(&o.ec.MaxNumBatchedTokens, "max-num-batched-tokens", sim.DefaultMaxNumBatchedTokens, "per-step token budget")
	seed := fs.Uint64("seed", 0, "output-token seed")
	fs.StringVar(&o.hashSeed, "hash-seed", "", "engine-hash salt (uint64); empty = random per server, like vLLM without PYTHONHASHSEED")
	fs.IntVar(&o.ec.VocabSize, "vocab-size", sim.DefaultVocabSize, "vocabulary size")
	fs.Float64Var(&o.speed, "speed", 1, "simulated seconds per wall second; 0 = as fast as possible")
	fs.StringVar(&o.clock, "clock", "wall", "simulated clock with --speed > 0: wall (wall time x speed) or paced (a busy engine's clock advances by step durations only; host stalls add no simulated time)")
	fs.Float64Var(&o.ec.StepBase, "step-base", sim.DefaultStepBase, "step time constant a (s); 0 = default, negative = zero")
	fs.Float64Var(&o.ec.PrefillPerToken, "prefill-per-token", sim.DefaultPrefillPerToken, "step time per uncached prefill token b (s); negative = zero")
	fs.Float64Var(&o.ec.DecodePerContextToken, "decode-per-context-token", 0, "step time per decode context token c (s); 0 = derive from --decode-full-kv, negative = zero")
	fs.Float64Var(&o.ec.DecodeFullKV, "decode-full-kv", sim.DefaultDecodeFullKV, "extra decode step time with a full KV cache (s)")
	fs.Float64Var(&o.ec.CPULoadPerBlock, "cpu-load-per-block", 0, "CPU tier load cost per block (s); 0 = 80us per 16 tokens, negative = zero")
	fs.Float64Var(&o.ec.SSDLoadPerBlock, "ssd-load-per-block", 0, "SSD tier load cost per block (s); 0 = 400us per 16 tokens, negative = zero")
	fs.IntVar(&o.dp, "data-parallel-size", 1, "engines per server (engine label values, event ports offset by rank)")
	fs.StringVar(&o.eventsEP, "kv-events-endpoint", "", "ZMQ PUB endpoint to bind, e.g. tcp://127.0.0.1:5557 (empty = off)")
	fs.StringVar(&o.replayEP, "kv-events-replay-endpoint", "", "ZMQ ROUTER replay endpoint to bind")
	fs.StringVar(&o.topic, "kv-events-topic", "", "topic frame; {host} {port} {model} are substituted")
	fs.StringVar(&o.encoding, "kv-events-encoding", "map", "event encoding: array (vLLM <= 0.23) or map (>= 0.24)")
	fs.IntVar(&o.bufferSteps, "kv-events-buffer-steps", 10000, "batches kept for replay")
	fs.IntVar(&o.replayLayout, "kv-events-replay-layout", 3, "replay reply shape: 2 (<= 0.25) or 3 (>= 0.26)")
	fs.BoolVar(&o.ec.LazyClearEvent, "kv-events-lazy-clear", false, "publish a reset's AllBlocksCleared with the engine's next step, as vLLM does (default: at the reset)")
	fs.IntVar(&o.dropEvery, "kv-events-drop-every", 0, "test hook: withhold every N-th batch from the live stream")
	fs.IntVar(&o.fleet, "fleet", 1, "number of servers on consecutive ports")
	fs.IntVar(&o.basePort, "base-port", -1, "first HTTP port of the fleet (default --port)")
	fs.IntVar(&o.baseEventPort, "base-event-port", 0, "first ZMQ port of the fleet (PUB E+2i, replay E+2i+1); 0 = use --kv-events-* (single server)")
	fs.StringVar(&o.hashAlgo, "prefix-caching-hash-algo", "xxhash", "value reported in vllm:cache_config_info")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug|info|warn|error")
	engineModel := fs.String("engine-model", "default", "step-time model: default | hbm (prefill attention over the context, decode cost from KV bytes and memory bandwidth)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var err error
	if o.ec, err = o.ec.WithModel(*engineModel); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.ec.Seed = *seed
	o.ec.ModelName = o.model
	if o.basePort < 0 {
		o.basePort = o.port
	}
	if o.fleet < 1 || o.dp < 1 {
		return nil, errors.New("--fleet and --data-parallel-size must be >= 1")
	}
	if o.clock != "wall" && o.clock != "paced" {
		return nil, fmt.Errorf("--clock %q: want wall or paced", o.clock)
	}
	if o.encoding != "array" && o.encoding != "map" {
		return nil, fmt.Errorf("--kv-events-encoding %q: want array or map", o.encoding)
	}
	if o.replayLayout != 2 && o.replayLayout != 3 {
		return nil, fmt.Errorf("--kv-events-replay-layout %d: want 2 or 3", o.replayLayout)
	}
	if o.fleet > 1 && o.baseEventPort == 0 && (o.eventsEP != "" || o.replayEP != "") {
		return nil, errors.New("a fleet derives event ports from --base-event-port; --kv-events-endpoint is for one server")
	}
	if o.fleet > 1 && o.basePort == 0 {
		return nil, errors.New("a fleet needs --base-port > 0")
	}
	if o.replayEP != "" && o.eventsEP == "" {
		return nil, errors.New("--kv-events-replay-endpoint needs --kv-events-endpoint")
	}
	return o, nil
}

func randomUint64() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}

func serverConfig(o *options, i int, log *slog.Logger) (server.Config, error) {
	ec := o.ec
	if o.hashSeed == "" {
		ec.HashSalt = randomUint64()
	} else {
		v, err := strconv.ParseUint(o.hashSeed, 0, 64)
		if err != nil {
			return server.Config{}, fmt.Errorf("--hash-seed: %w", err)
		}
		ec.HashSalt = v
	}
	port := o.basePort + i
	cfg := server.Config{
		Engine:                ec,
		DataParallelSize:      o.dp,
		Addr:                  net.JoinHostPort(o.host, strconv.Itoa(port)),
		Speed:                 o.speed,
		PacedClock:            o.clock == "paced",
		KVEventsBufferSteps:   o.bufferSteps,
		KVEventsReplayLayout:  o.replayLayout,
		KVEventsDropEvery:     o.dropEvery,
		PrefixCachingHashAlgo: o.hashAlgo,
		Logger:                log.With("server", i),
	}
	if o.encoding == "map" {
		cfg.KVEventsLayout = kvcrouter.EventLayoutMap
	}
	if o.baseEventPort > 0 {
		p := o.baseEventPort + 2*i*o.dp
		cfg.KVEventsEndpoint = "tcp://" + net.JoinHostPort(o.host, strconv.Itoa(p))
		cfg.KVEventsReplayEndpoint = "tcp://" + net.JoinHostPort(o.host, strconv.Itoa(p+o.dp))
	} else {
		cfg.KVEventsEndpoint, cfg.KVEventsReplayEndpoint = o.eventsEP, o.replayEP
	}
	cfg.KVEventsTopic = strings.NewReplacer("{host}", o.host, "{port}", strconv.Itoa(port), "{model}", o.model).Replace(o.topic)
	return cfg, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	var servers []*server.Server
	defer func() {
		for _, s := range servers {
			_ = s.Close()
		}
	}()
	enc := json.NewEncoder(stdout)
	for i := 0; i < o.fleet; i++ {
		cfg, err := serverConfig(o, i, log)
		if err != nil {
			return err
		}
		s, err := server.New(cfg)
		if err != nil {
			return fmt.Errorf("server %d: %w", i, err)
		}
		servers = append(servers, s)
		_, portStr, _ := net.SplitHostPort(strings.TrimPrefix(s.URL(), "http://"))
		port, _ := strconv.Atoi(portStr)
		info := ServerInfo{Index: i, URL: s.URL(), Port: port, Model: o.model, KVEvents: s.KVEventsEndpoints(),
			KVEventsReplay: s.ReplayEndpoints(), Topic: cfg.KVEventsTopic, DataParallelSize: o.dp,
			BlockSize: o.ec.BlockSize, NumGPUBlocks: o.ec.NumGPUBlocks}
		if info.KVEvents == nil {
			info.KVEvents = []string{}
		}
		if info.KVEventsReplay == nil {
			info.KVEventsReplay = []string{}
		}
		if err := enc.Encode(info); err != nil {
			return err
		}
		log.Info("serving", "index", i, "url", info.URL, "kv_events", info.KVEvents, "replay", info.KVEventsReplay)
	}
	<-ctx.Done()
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, s := range servers {
			if err := s.Shutdown(sctx); err != nil {
				log.Warn("shutdown", "err", err)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		servers = nil
		return errors.New("shutdown timed out")
	}
	servers = nil
	return nil
}
