// Package bench replays LLM request workloads against several simulated
// engines (testbed/sim) on one virtual clock, routing every request through a
// kvc-router Router, and measures what each routing policy achieves: prefix
// hit rate, TTFT, end-to-end latency, throughput, rollout-step makespan,
// load imbalance and router decision time. It also computes what a policy
// is judged against: the infinite-cache oracle hit rate (an upper bound),
// one pooled LRU over all engines' capacity (a reference, not a bound) and
// the prefill-free makespan (each step's makespan had every prompt been
// fully cached: the gain prefix caching can at most bring).
//
// Workloads are seeded and deterministic: the same seed gives the same
// requests (and, because every engine shares one sampling seed, the same
// generated tokens whatever the routing).
package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"sort"

	"github.com/kvc-router/kvc-router/testbed/sim"
)

// Item is one request of a workload.
type Item struct {
	// Key is the request_id the router sees (verl: one per sample, one per
	// multi-turn trajectory).
	Key string
	// ID is unique per submission (the engine's request id).
	ID string
	// At is the arrival time in virtual seconds.
	At        float64
	Phase     int
	MaxTokens int
	// Seed is the sampling seed (distinct per sample of a group).
	Seed uint64

	prompt []int32 // materialised prompt (grpo, agent)
	// mooncake: built on demand
	hashIDs  []int64
	inputLen int
	// agent bookkeeping
	traj, turn int
	seq        int
	// Group is the item's prompt (task) in the workload's dataset and
	// Epoch the dataset epoch it was drawn in (shaped workloads).
	Group, Epoch int
	// chained items depend on the previous item with the same Key (agent
	// turns): think is the tool latency before this one, first the
	// arrival of the chain's first item (for the makespan lower bound).
	chained bool
	think   float64
	first   float64
}

// PromptLen is the prompt length in tokens.
func (it *Item) PromptLen() int {
	if it.prompt != nil {
		return len(it.prompt)
	}
	return it.inputLen
}

// Workload generates requests phase by phase. A phase (a rollout step for
// grpo/agent; the whole trace for mooncake) ends when every request issued
// in it has completed; between phases the driver performs a weight update
// when ResetBetweenPhases is true.
type Workload interface {
	Name() string
	Phases() int
	ResetBetweenPhases() bool
	// Start returns the arrivals of phase p, which begins at start.
	Start(p int, start float64) []*Item
	// Prompt returns the item's prompt tokens, possibly in buf.
	Prompt(it *Item, buf []int32) []int32
	// Done reports a completion at now with the generated tokens and
	// returns follow-up arrivals (next agent turn).
	Done(it *Item, output []int32, now float64) []*Item
}

// ---------------------------------------------------------------- mooncake

// TraceBlock is the Mooncake trace's block size in tokens.
const TraceBlock = 512

// MooncakeRow is one line of a Mooncake trace.
type MooncakeRow struct {
	Timestamp    float64 `json:"timestamp"`
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// MooncakeConfig configures the Mooncake replay.
type MooncakeConfig struct {
	// RateScale > 1 speeds arrivals up (timestamps are divided by it).
	RateScale float64
	// Limit keeps the first Limit rows (0 = all).
	Limit int
	// Jitter spreads each row uniformly inside its timestamp bin of
	// BinSeconds (the public trace is quantised to 3 s); 0 disables.
	BinSeconds float64
	Seed       uint64
	// Vocab bounds synthetic token ids (default 32000).
	Vocab int
}

// Mooncake replays a Mooncake-format trace. Token ids are synthesised per
// hash id (512 tokens each, a pure function of the id), so equal ids give
// equal tokens and a shared id prefix is a shared token prefix; the last
// block is cut to input_length. Arrival = (timestamp + U[0, bin)) / rate.
type Mooncake struct {
	cfg   MooncakeConfig
	Rows  []MooncakeRow
	items []*Item
}

// LoadMooncake reads a trace file.
func LoadMooncake(path string, cfg MooncakeConfig) (*Mooncake, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadMooncake(f, cfg)
}

// ReadMooncake parses a trace and prepares its arrivals.
func ReadMooncake(r io.Reader, cfg MooncakeConfig) (*Mooncake, error) {
	if cfg.RateScale <= 0 {
		cfg.RateScale = 1
	}
	if cfg.Vocab <= 0 {
		cfg.Vocab = 32000
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	var rows []MooncakeRow
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var row MooncakeRow
		if err := json.Unmarshal(b, &row); err != nil {
			return nil, fmt.Errorf("mooncake line %d: %w", line, err)
		}
		if row.InputLength <= 0 || row.OutputLength <= 0 || len(row.HashIDs) == 0 ||
			(row.InputLength+TraceBlock-1)/TraceBlock != len(row.HashIDs) {
			return nil, fmt.Errorf("mooncake line %d: need input_length > 0, output_length > 0 and ceil(input_length/512) hash ids", line)
		}
		rows = append(rows, row)
		if cfg.Limit > 0 && len(rows) == cfg.Limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	m := &Mooncake{cfg: cfg, Rows: rows}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6d6f6f6e))
	for i, row := range rows {
		t := row.Timestamp / 1000
		if cfg.BinSeconds > 0 {
			t += rng.Float64() * cfg.BinSeconds
		}
		m.items = append(m.items, &Item{
			Key: fmt.Sprintf("mc-%d", i), ID: fmt.Sprintf("mc-%d", i), At: t / cfg.RateScale,
			MaxTokens: row.OutputLength, Seed: uint64(i), hashIDs: row.HashIDs, inputLen: row.InputLength, seq: i,
		})
	}
	sort.SliceStable(m.items, func(a, b int) bool { return m.items[a].At < m.items[b].At })
	return m, nil
}

// Name implements Workload.
func (m *Mooncake) Name() string { return "mooncake" }

// Phases implements Workload.
func (m *Mooncake) Phases() int { return 1 }

// ResetBetweenPhases implements Workload.
func (m *Mooncake) ResetBetweenPhases() bool { return false }

// Start implements Workload.
func (m *Mooncake) Start(_ int, start float64) []*Item {
	out := make([]*Item, len(m.items))
	for i, it := range m.items {
		c := *it
		c.At += start
		out[i] = &c
	}
	return out
}

// Done implements Workload.
func (m *Mooncake) Done(*Item, []int32, float64) []*Item { return nil }

// Prompt implements Workload.
func (m *Mooncake) Prompt(it *Item, buf []int32) []int32 {
	return SynthPrompt(it.hashIDs, it.inputLen, m.cfg.Vocab, buf[:0])
}

// SynthPrompt appends the synthetic tokens of a hash-id chain cut to n tokens.
func SynthPrompt(ids []int64, n, vocab int, dst []int32) []int32 {
	for _, h := range ids {
		for j := 0; j < TraceBlock && len(dst) < n; j++ {
			dst = append(dst, SynthToken(h, j, vocab))
		}
	}
	return dst
}

// SynthToken is token j of hash id h.
func SynthToken(h int64, j, vocab int) int32 {
	return int32(sim.Mix64(uint64(h)*0x9e3779b97f4a7c15^uint64(j)*0xbf58476d1ce4e5b9) % uint64(vocab))
}

// TraceOracle is the reference oracle on the trace's own 512-token blocks:
// Σ min(512·k, input) / Σ input with k the longest previously seen chain.
func (m *Mooncake) TraceOracle() float64 {
	type node struct {
		parent int64
		id     int64
	}
	seen := map[node]struct{}{}
	chainID := map[node]int64{}
	var hit, total float64
	for _, it := range m.items {
		parent := int64(-1)
		k := 0
		matching := true
		for _, h := range it.hashIDs {
			nd := node{parent, h}
			if _, ok := seen[nd]; ok && matching {
				k++
			} else {
				matching = false
				seen[nd] = struct{}{}
			}
			c, ok := chainID[nd]
			if !ok {
				c = int64(len(chainID))
				chainID[nd] = c
			}
			parent = c
		}
		hit += math.Min(float64(TraceBlock*k), float64(it.inputLen))
		total += float64(it.inputLen)
	}
	if total == 0 {
		return 0
	}
	return hit / total
}

// ------------------------------------------------------------------ shared

// LogNormal is a length distribution: exp(N(ln Median, Sigma)) clamped to
// [Min, Max]. Sigma 0 gives Median exactly.
type LogNormal struct {
	Median float64 `json:"median"`
	Sigma  float64 `json:"sigma"`
	Min    int     `json:"min"`
	Max    int     `json:"max"`
}

// Draw samples one length.
func (d LogNormal) Draw(rng *rand.Rand) int {
	v := d.Median * math.Exp(d.Sigma*rng.NormFloat64())
	n := int(math.Round(v))
	if d.Min > 0 && n < d.Min {
		n = d.Min
	}
	if n < 1 {
		n = 1
	}
	if d.Max > 0 && n > d.Max {
		n = d.Max
	}
	return n
}

func randTokens(rng *rand.Rand, n, vocab int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(rng.IntN(vocab))
	}
	return out
}

// -------------------------------------------------------------------- grpo

// GRPOConfig configures the grpo workload.
type GRPOConfig struct {
	// Name labels the workload in reports (default "grpo").
	Name    string `json:"name,omitempty"`
	Steps   int    `json:"steps"`
	Prompts int    `json:"prompts"` // B
	N       int    `json:"n"`       // samples per prompt
	// SystemTokens is a system prompt shared by every prompt of every step.
	SystemTokens int       `json:"system_tokens"`
	Prompt       LogNormal `json:"prompt"`
	Response     LogNormal `json:"response"`
	Seed         uint64    `json:"seed"`
	Vocab        int       `json:"vocab"`
	// Shape, when set, draws responses with RL's length structure
	// (rlshape.go): correlated within a group, recurring prompts,
	// stratified quantiles. Nil keeps the independent draws.
	Shape *Shape `json:"shape,omitempty"`
}

// DefaultGRPO: 3 steps of 64 prompts × 16 samples (1,024 requests per step),
// a 256-token shared system prompt, prompts lognormal(median 1,024,
// σ 0.6, 64..8,192) and long-tailed responses lognormal(median 1,024, σ 0.9,
// 16..8,192): a math/code RL rollout at verl-like batch sizes.
func DefaultGRPO() GRPOConfig {
	return GRPOConfig{Steps: 3, Prompts: 64, N: 16, SystemTokens: 256,
		Prompt:   LogNormal{Median: 1024, Sigma: 0.6, Min: 64, Max: 8192},
		Response: LogNormal{Median: 1024, Sigma: 0.9, Min: 16, Max: 8192}, Vocab: 32000}
}

// DefaultGRPOSat is an oversubscribed reasoning-RL step: 2 steps of 512
// prompts × 16 samples (8,192 sequences a step, 4× the 2,048 slots of 8
// engines at max_num_seqs 256), responses lognormal(median 1,024, σ 1.0,
// 16..16,384): most answers are short and a few reason at length, so the
// step's last sequences decide its makespan.
func DefaultGRPOSat() GRPOConfig {
	g := DefaultGRPO()
	g.Name = "grpo_sat"
	g.Steps, g.Prompts = 2, 512
	g.Response = LogNormal{Median: 1024, Sigma: 1.0, Min: 16, Max: 16384}
	return g
}

// GRPO submits B prompts × n samples together at the start of each rollout
// step; each sample has its own request_id (as verl assigns them) and its
// own sampling seed. Prompts are fresh every step (new data batch).
type GRPO struct {
	cfg    GRPOConfig
	system []int32
	ds     *dataset
}

// NewGRPO builds the workload.
func NewGRPO(cfg GRPOConfig) *GRPO {
	if cfg.Vocab <= 0 {
		cfg.Vocab = 32000
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x73797374))
	g := &GRPO{cfg: cfg, system: randTokens(rng, cfg.SystemTokens, cfg.Vocab)}
	if cfg.Shape != nil {
		g.ds = newDataset(cfg.Seed, *cfg.Shape, cfg.Prompts)
	}
	return g
}

// Name implements Workload.
func (g *GRPO) Name() string {
	if g.cfg.Name != "" {
		return g.cfg.Name
	}
	return "grpo"
}

// Phases implements Workload.
func (g *GRPO) Phases() int { return g.cfg.Steps }

// ResetBetweenPhases implements Workload.
func (g *GRPO) ResetBetweenPhases() bool { return true }

// Start implements Workload.
func (g *GRPO) Start(p int, start float64) []*Item {
	if g.ds != nil {
		return g.shapedStart(p, start)
	}
	rng := rand.New(rand.NewPCG(g.cfg.Seed, uint64(p)+1))
	var out []*Item
	for b := 0; b < g.cfg.Prompts; b++ {
		body := randTokens(rng, g.cfg.Prompt.Draw(rng), g.cfg.Vocab)
		prompt := append(append(make([]int32, 0, len(g.system)+len(body)), g.system...), body...)
		for s := 0; s < g.cfg.N; s++ {
			id := fmt.Sprintf("st%d-p%d-s%d", p, b, s)
			out = append(out, &Item{Key: id, ID: id, At: start, Phase: p, MaxTokens: g.cfg.Response.Draw(rng),
				Seed: uint64(p)<<32 | uint64(b)<<12 | uint64(s), prompt: prompt, seq: len(out)})
		}
	}
	return out
}

// Prompt implements Workload.
func (g *GRPO) Prompt(it *Item, _ []int32) []int32 { return it.prompt }

// Done implements Workload.
func (g *GRPO) Done(*Item, []int32, float64) []*Item { return nil }

// ------------------------------------------------------------------- agent

// AgentConfig configures the agent workload.
type AgentConfig struct {
	// Name labels the workload in reports (default "agent").
	Name  string `json:"name,omitempty"`
	Steps int    `json:"steps"`
	Tasks int    `json:"tasks"`
	// Group trajectories per task share the task prompt (GRPO over agents).
	Group        int       `json:"group"`
	MinTurns     int       `json:"min_turns"`
	MaxTurns     int       `json:"max_turns"`
	SystemTokens int       `json:"system_tokens"`
	Task         LogNormal `json:"task"`
	Response     LogNormal `json:"response"`
	Tool         LogNormal `json:"tool"`
	// ToolLatency is the tool's execution time in seconds (lognormal
	// median/sigma; Min/Max ignored).
	ToolLatencyMedian float64 `json:"tool_latency_median_s"`
	ToolLatencySigma  float64 `json:"tool_latency_sigma"`
	// MaxContext ends a trajectory once its next prompt would exceed it.
	MaxContext int    `json:"max_context"`
	Seed       uint64 `json:"seed"`
	Vocab      int    `json:"vocab"`
	// Shape, when set, gives each task a difficulty that correlates its
	// trajectories' turn counts and turn lengths (rlshape.go); nil keeps
	// independent draws.
	Shape *Shape `json:"shape,omitempty"`
	// ToolPareto, when set, replaces the lognormal tool latency with a
	// bounded Pareto (heavy-tailed sandbox times).
	ToolPareto *BoundedPareto `json:"tool_latency_pareto,omitempty"`
}

// DefaultAgent: 3 steps of 32 tasks × 4 trajectories, 4–12 turns each, a
// 1,024-token shared system prompt, task prompts lognormal(median 1,024),
// responses lognormal(median 384, σ 0.8, ≤ 4,096), tool outputs
// lognormal(median 512, σ 0.8, ≤ 4,096), tool latency lognormal(median
// 0.5 s, σ 0.8), context capped at 32,768 tokens.
func DefaultAgent() AgentConfig {
	return AgentConfig{Steps: 3, Tasks: 32, Group: 4, MinTurns: 4, MaxTurns: 12, SystemTokens: 1024,
		Task:              LogNormal{Median: 1024, Sigma: 0.5, Min: 64, Max: 8192},
		Response:          LogNormal{Median: 384, Sigma: 0.8, Min: 8, Max: 4096},
		Tool:              LogNormal{Median: 512, Sigma: 0.8, Min: 8, Max: 4096},
		ToolLatencyMedian: 0.5, ToolLatencySigma: 0.8, MaxContext: 32768, Vocab: 32000}
}

// Agent runs multi-turn trajectories: one request_id per trajectory; turn
// t+1's prompt is turn t's prompt + turn t's generated tokens + a tool
// output, submitted when turn t finishes plus the tool latency.
type Agent struct {
	cfg    AgentConfig
	system []int32
	trajs  map[int]*agentTraj
	ds     *dataset
}

type agentTraj struct {
	key   string
	turns int
	// Per-trajectory draws, fixed by the seed (independent of timing).
	resp  []int
	tool  [][]int32
	lat   []float64
	phase int
}

// NewAgent builds the workload.
func NewAgent(cfg AgentConfig) *Agent {
	if cfg.Vocab <= 0 {
		cfg.Vocab = 32000
	}
	if cfg.Group <= 0 {
		cfg.Group = 1
	}
	if cfg.MaxTurns < cfg.MinTurns {
		cfg.MaxTurns = cfg.MinTurns
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x73797374))
	a := &Agent{cfg: cfg, system: randTokens(rng, cfg.SystemTokens, cfg.Vocab), trajs: map[int]*agentTraj{}}
	if cfg.Shape != nil {
		a.ds = newDataset(cfg.Seed, *cfg.Shape, cfg.Tasks)
	}
	return a
}

// Name implements Workload.
func (a *Agent) Name() string {
	if a.cfg.Name != "" {
		return a.cfg.Name
	}
	return "agent"
}

// Phases implements Workload.
func (a *Agent) Phases() int { return a.cfg.Steps }

// ResetBetweenPhases implements Workload.
func (a *Agent) ResetBetweenPhases() bool { return true }

// Start implements Workload.
func (a *Agent) Start(p int, start float64) []*Item {
	if a.ds != nil {
		return a.shapedStart(p, start)
	}
	rng := rand.New(rand.NewPCG(a.cfg.Seed, uint64(p)+1))
	var out []*Item
	for t := 0; t < a.cfg.Tasks; t++ {
		body := randTokens(rng, a.cfg.Task.Draw(rng), a.cfg.Vocab)
		prompt := append(append(make([]int32, 0, len(a.system)+len(body)), a.system...), body...)
		for g := 0; g < a.cfg.Group; g++ {
			idx := p*1_000_000 + t*1000 + g
			tr := &agentTraj{key: fmt.Sprintf("st%d-t%d-g%d", p, t, g), phase: p}
			tr.turns = a.cfg.MinTurns + rng.IntN(a.cfg.MaxTurns-a.cfg.MinTurns+1)
			for k := 0; k < tr.turns; k++ {
				tr.resp = append(tr.resp, a.cfg.Response.Draw(rng))
				tr.tool = append(tr.tool, randTokens(rng, a.cfg.Tool.Draw(rng), a.cfg.Vocab))
				tr.lat = append(tr.lat, a.cfg.ToolLatencyMedian*math.Exp(a.cfg.ToolLatencySigma*rng.NormFloat64()))
			}
			a.trajs[idx] = tr
			out = append(out, &Item{Key: tr.key, ID: tr.key + "-0", At: start, Phase: p, MaxTokens: tr.resp[0],
				Seed: uint64(idx), prompt: prompt, traj: idx, turn: 0, seq: len(out), chained: true})
		}
	}
	return out
}

// Prompt implements Workload.
func (a *Agent) Prompt(it *Item, _ []int32) []int32 { return it.prompt }

// Done implements Workload.
func (a *Agent) Done(it *Item, output []int32, now float64) []*Item {
	tr := a.trajs[it.traj]
	next := it.turn + 1
	if tr == nil || next >= tr.turns {
		delete(a.trajs, it.traj)
		return nil
	}
	tool := tr.tool[it.turn]
	n := len(it.prompt) + len(output) + len(tool)
	if a.cfg.MaxContext > 0 && n+tr.resp[next] > a.cfg.MaxContext {
		delete(a.trajs, it.traj)
		return nil
	}
	prompt := make([]int32, 0, n)
	prompt = append(append(append(prompt, it.prompt...), output...), tool...)
	return []*Item{{Key: tr.key, ID: fmt.Sprintf("%s-%d", tr.key, next), At: now + tr.lat[it.turn], Phase: it.Phase,
		MaxTokens: tr.resp[next], Seed: it.Seed, prompt: prompt, traj: it.traj, turn: next,
		chained: true, think: tr.lat[it.turn], first: it.first, Group: it.Group, Epoch: it.Epoch}}
}

// DefaultAgentScale is an agentic RL step at scale: 1 step of 256 tasks ×
// 8 trajectories (2,048 multi-turn sessions; kvbench runs it at
// max_num_seqs 128, 2× the fleet's 1,024 slots), 4–8 turns each with tool
// latency lognormal(median 1 s): at any time many sessions wait on tools
// while more than the fleet can run wait on it.
func DefaultAgentScale() AgentConfig {
	a := DefaultAgent()
	a.Steps, a.Tasks, a.Group, a.MaxTurns = 1, 256, 8, 8
	a.ToolLatencyMedian = 1
	a.Name = "agent_scale"
	return a
}

// DefaultAgentLongFew is DefaultAgentLong with fewer tasks than engines,
// the arena's long_agent shape: 2 steps of 2 tasks × 4 trajectories
// (kvbench runs it on 4 engines). Placing a task's trajectories together
// saves one task-prompt prefill and leaves half the fleet idle.
func DefaultAgentLongFew() AgentConfig {
	a := DefaultAgentLong()
	a.Tasks, a.Group = 2, 4
	a.Name = "agent_long_few"
	return a
}

// DefaultAgentLong is a long-context agent, where prefill dominates: 2 steps
// of 8 tasks × 4 trajectories, 20–40 turns, tool outputs lognormal(median
// 2,048, σ 0.4, 1,024..4,096), responses lognormal(median 256, σ 0.6,
// ≤ 512), tool latency lognormal(median 0.5 s), context capped at 65,536.
func DefaultAgentLong() AgentConfig {
	a := DefaultAgent()
	a.Steps, a.Tasks, a.Group, a.MinTurns, a.MaxTurns = 2, 8, 4, 20, 40
	a.Tool = LogNormal{Median: 2048, Sigma: 0.4, Min: 1024, Max: 4096}
	a.Response = LogNormal{Median: 256, Sigma: 0.6, Min: 8, Max: 512}
	a.MaxContext = 65536
	a.Name = "agent_long"
	return a
}
