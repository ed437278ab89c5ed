package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
)

// explain prints a status document's last_decision stage by stage. It
// accepts what operators have at hand: the balancer's get_status() (the
// decision under "router"), kvr_status's JSON (the same), or the
// last_decision object itself.
func explain(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("explain", "explain [--dry-run] FILE|-\n\nReads a status document (get_status() or kvr_status JSON, or its last_decision) and prints\nthe last routing decision: candidates, each filter's removals, each candidate's score terms,\nthe pick and the session rule. With --dry-run FILE is a scenario instead (a configuration,\neach server's metrics, cached prompts and in-flight count, session bindings, one request):\nits decision is made on a private router and explained; nothing is routed.", stderr)
	limit := fs.Int("max-bytes", 64<<20, "reject documents larger than this")
	dry := fs.Bool("dry-run", false, "FILE is a scenario: explain the decision its request would get")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	data, err := readInput(fs, pos, stdin, *limit, "document")
	if err != nil {
		return err
	}
	if *dry {
		return explainDryRun(data, stdout)
	}
	e, err := findDecision(data)
	if err != nil {
		return err
	}
	return printExplain(stdout, e)
}

// findDecision extracts the Explain from any of the accepted shapes.
func findDecision(data []byte) (*kvcrouter.Explain, error) {
	var doc struct {
		Router *struct {
			LastDecision json.RawMessage `json:"last_decision"`
		} `json:"router"`
		LastDecision json.RawMessage `json:"last_decision"`
		Pool         json.RawMessage `json:"pool"`
		Session      json.RawMessage `json:"session"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("input is not a JSON object: %v", err)
	}
	raw := data
	switch {
	case doc.Router != nil:
		raw = doc.Router.LastDecision
	case doc.LastDecision != nil:
		raw = doc.LastDecision
	case doc.Pool == nil || doc.Session == nil:
		return nil, errors.New(`no decision found: expected a status document ({"router": {"last_decision": ...}}) or a last_decision object`)
	}
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New("the router has made no decision yet (last_decision is null)")
	}
	var e kvcrouter.Explain
	if err := json.Unmarshal(raw, &e); err != nil {
		return nil, fmt.Errorf("last_decision: %v", err)
	}
	return &e, nil
}

func printExplain(w io.Writer, e *kvcrouter.Explain) error {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("decision %d: request %q, %d prompt tokens, mode %s\n", e.Seq, e.RequestID, e.PromptTokens, e.Mode)
	if e.Error != "" {
		p("  failed: %s\n", e.Error)
	}
	p("1 candidates  %s\n", strings.Join(e.Pool, " "))
	bound := "none"
	if e.Session.Bound != "" {
		bound = e.Session.Bound
	}
	p("2 session     bound to %s; rule %s: %s\n", bound, e.Session.Rule, e.Session.Why)
	if len(e.Filters) == 0 {
		p("3 filters     (none ran)\n")
	}
	for i, f := range e.Filters {
		head := "             "
		if i == 0 {
			head = "3 filters    "
		}
		removed := "removed nothing"
		if len(f.Removed) > 0 {
			parts := make([]string, len(f.Removed))
			for k, r := range f.Removed {
				parts[k] = r.Server + " (" + r.Why + ")"
			}
			removed = "removed " + strings.Join(parts, ", ")
		}
		p("%s %s: %s", head, f.Name, removed)
		if f.Note != "" {
			p("; %s", f.Note)
		}
		p("\n")
	}
	if !e.Scored {
		p("4 scorers     (not run: %s)\n", e.Session.Rule)
	} else {
		p("4 scorers     %s\n", e.Strategy)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	var names []string
	for _, c := range e.Candidates {
		for _, t := range c.Terms {
			if !contains(names, t.Name) {
				names = append(names, t.Name)
			}
		}
	}
	fmt.Fprint(tw, "\tserver\tinflight\tstore_load\tsessions\thit gpu/cpu/ssd\t")
	for _, n := range names {
		fmt.Fprintf(tw, "%s\t", n)
	}
	if len(names) == 0 && e.Scored {
		fmt.Fprint(tw, "score\t")
	}
	fmt.Fprint(tw, "\n")
	for _, c := range e.Candidates {
		mark := ""
		switch {
		case c.Server == e.Decision.Server:
			mark = "→"
		case c.Masked:
			mark = "masked"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.3f\t%d\t%d/%d/%d of %d\t", mark, c.Server, c.Inflight, c.Load, c.Sessions,
			c.HitBlocks[0], c.HitBlocks[1], c.HitBlocks[2], c.HittableBlocks)
		for _, n := range names {
			v := "-"
			for _, t := range c.Terms {
				if t.Name == n {
					v = fmt.Sprintf("%.4f", t.Value)
				}
			}
			fmt.Fprintf(tw, "%s\t", v)
		}
		if len(names) == 0 && c.Score != nil {
			fmt.Fprintf(tw, "%.4f\t", *c.Score)
		}
		fmt.Fprint(tw, "\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	p("5 pick        %s (%s)\n", e.Decision.Server, e.Pick)
	p("  decision    reason %s\n", e.Decision.Reason)
	return nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
