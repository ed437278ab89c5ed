package metrics

import (
	"bytes"
	"strconv"
	"sync"

	dto "github.com/prometheus/client_model/go"
)

// fastFamilies parses the lines filter kept (a few dozen samples of the
// families the flavor reads) into metric families without expfmt, whose
// general parser costs ~60 us per scrape in allocations. It accepts only a
// strict, common subset of the text format: TYPE/HELP lines without
// escapes, each family's lines contiguous, at most one TYPE and one HELP
// per family and TYPE before its samples, types gauge/counter/untyped,
// label values without backslashes, no duplicate label names, no
// timestamps, plain decimal values. On anything else it returns ok=false
// and the caller runs expfmt, which stays the reference parser and
// validator (a test checks both agree on every fixture and fuzz seed).
func fastFamilies(text []byte) (map[string]*dto.MetricFamily, bool) {
	return new(fastArena).readFamilies(text)
}

// readFamilies is fastFamilies with a's memory; the result is valid until
// a.reset.
func (a *fastArena) readFamilies(text []byte) (map[string]*dto.MetricFamily, bool) {
	if a.fams == nil {
		a.fams, a.seenHelp = make(map[string]*dto.MetricFamily, 16), make(map[string]bool, 16)
	}
	fams, seenHelp := a.fams, a.seenHelp
	// One string holds all kept text: names and label values are its
	// substrings, and the protobuf structs come from slabs, so a scrape
	// costs a few dozen allocations instead of one per field.
	str := string(text)
	base := 0 // offset of the current line in str
	a.size(text)
	var cur *dto.MetricFamily
	for len(text) > 0 {
		var line []byte
		lineAt := base
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
			base += i + 1
		} else {
			line, text = text, nil
		}
		// sub returns b, a subslice of line, as a substring of str.
		sub := func(b []byte) string {
			if len(b) == 0 {
				return ""
			}
			off := lineAt + cap(line) - cap(b)
			return str[off : off+len(b)]
		}
		if len(line) == 0 {
			continue
		}
		if line[0] == '#' {
			kw, rest := word(line[1:])
			name, rest := word(rest)
			if bytes.IndexByte(rest, '\\') >= 0 || len(name) == 0 {
				return nil, false
			}
			f, ok := fams[string(name)]
			if ok && f != cur {
				return nil, false // family lines not contiguous
			}
			if !ok {
				f = a.family(sub(name))
				fams[*f.Name] = f
			}
			cur = f
			switch string(kw) {
			case "HELP":
				if seenHelp[*f.Name] {
					return nil, false
				}
				seenHelp[*f.Name] = true
				f.Help = a.str(sub(trimBlank(rest)))
			case "TYPE":
				if f.Type != nil || len(f.Metric) > 0 {
					return nil, false
				}
				typ, tail := word(rest)
				if len(trimBlank(tail)) != 0 {
					return nil, false
				}
				var t dto.MetricType
				switch string(typ) {
				case "gauge":
					t = dto.MetricType_GAUGE
				case "counter":
					t = dto.MetricType_COUNTER
				case "untyped":
					t = dto.MetricType_UNTYPED
				default:
					return nil, false
				}
				f.Type = &t
			default:
				return nil, false
			}
			continue
		}
		n := 0
		for n < len(line) && isNameByte(line[n], n == 0) {
			n++
		}
		name, rest := line[:n], line[n:]
		f, ok := fams[string(name)]
		if ok && f != cur {
			return nil, false
		}
		if !ok {
			f = a.family(sub(name))
			fams[*f.Name] = f
		}
		cur = f
		m := a.metrics.next()
		if len(rest) > 0 && rest[0] == '{' {
			var okL bool
			if m.Label, rest, okL = fastLabels(rest, sub, a); !okL {
				return nil, false
			}
		}
		if len(rest) == 0 || rest[0] != ' ' {
			return nil, false
		}
		val := rest[1:]
		if len(val) == 0 || blankIndex(val) >= 0 || !plainFloat(val) {
			return nil, false // timestamps, odd spacing, odd values: expfmt
		}
		v := a.floats.next()
		var err error
		if *v, err = strconv.ParseFloat(sub(val), 64); err != nil {
			return nil, false
		}
		switch {
		case f.Type == nil:
			t := dto.MetricType_UNTYPED
			f.Type = &t
			m.Untyped = a.untyped.next()
			m.Untyped.Value = v
		case *f.Type == dto.MetricType_GAUGE:
			m.Gauge = a.gauges.next()
			m.Gauge.Value = v
		case *f.Type == dto.MetricType_COUNTER:
			m.Counter = a.counters.next()
			m.Counter.Value = v
		default:
			m.Untyped = a.untyped.next()
			m.Untyped.Value = v
		}
		for _, o := range f.Metric {
			if sameLabels(o.Label, m.Label) {
				return nil, false // duplicate series: let expfmt judge
			}
		}
		f.Metric = append(f.Metric, m)
	}
	for name, f := range fams {
		if len(f.Metric) == 0 {
			delete(fams, name) // expfmt drops families without samples
		}
	}
	return fams, true
}

// fastLabels parses `{a="x",b="y"}` (optionally with a trailing comma) and
// returns the pairs and the rest of the line. The pairs' slice is a
// capacity-capped window of a.lps, so no later append can overwrite it.
func fastLabels(s []byte, sub func([]byte) string, a *fastArena) ([]*dto.LabelPair, []byte, bool) {
	s = s[1:]
	start := len(a.lps)
	for {
		if len(s) > 0 && s[0] == '}' {
			if len(a.lps) == start {
				return nil, s[1:], true
			}
			return a.lps[start:len(a.lps):len(a.lps)], s[1:], true
		}
		n := 0
		for n < len(s) && (s[n] == '_' || (s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') || (n > 0 && s[n] >= '0' && s[n] <= '9')) {
			n++
		}
		if n == 0 || n+1 >= len(s) || s[n] != '=' || s[n+1] != '"' {
			return nil, nil, false
		}
		name := sub(s[:n])
		if len(name) >= 2 && name[:2] == "__" {
			return nil, nil, false // reserved names: expfmt's rules
		}
		s = s[n+2:]
		end := bytes.IndexByte(s, '"')
		if end < 0 || bytes.IndexByte(s[:end], '\\') >= 0 || bytes.IndexByte(s[:end], '\n') >= 0 {
			return nil, nil, false
		}
		for _, l := range a.lps[start:] {
			if l.GetName() == name {
				return nil, nil, false
			}
		}
		lp := a.labels.next()
		lp.Name, lp.Value = a.str(name), a.str(sub(s[:end]))
		a.lps = append(a.lps, lp)
		s = s[end+1:]
		if len(s) > 0 && s[0] == ',' {
			s = s[1:]
			continue
		}
		if len(s) == 0 || s[0] != '}' {
			return nil, nil, false
		}
	}
}

func sameLabels(a, b []*dto.LabelPair) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		found := false
		for _, y := range b {
			if x.GetName() == y.GetName() {
				found = x.GetValue() == y.GetValue()
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// slab hands out pointers to zeroed T from chunks of 32: pointers stay
// valid because a full chunk is replaced, never grown.
type slab[T any] struct{ buf []T }

// reserve makes the current chunk hold n more before the next allocation.
func (s *slab[T]) reserve(n int) {
	if cap(s.buf)-len(s.buf) < n {
		s.buf = make([]T, 0, n)
	}
}

// reset zeroes what was handed out and keeps the current chunk.
func (s *slab[T]) reset() {
	clear(s.buf)
	s.buf = s.buf[:0]
}

func (s *slab[T]) next() *T {
	if len(s.buf) == cap(s.buf) {
		s.buf = make([]T, 0, 32)
	}
	s.buf = s.buf[:len(s.buf)+1]
	return &s.buf[len(s.buf)-1]
}

// fastArena batches the allocations of fastFamilies calls. parse reuses
// one from arenaPool: a scrape then allocates little more than its kept
// text as one string.
type fastArena struct {
	strs     slab[string]
	floats   slab[float64]
	labels   slab[dto.LabelPair]
	metrics  slab[dto.Metric]
	families slab[dto.MetricFamily]
	gauges   slab[dto.Gauge]
	counters slab[dto.Counter]
	untyped  slab[dto.Untyped]
	lps      []*dto.LabelPair // backs every Metric.Label
	fams     map[string]*dto.MetricFamily
	seenHelp map[string]bool
}

// size gives each slab room for an upper bound of what text needs, so a
// scrape takes at most one chunk per slab.
func (a *fastArena) size(text []byte) {
	lines := bytes.Count(text, []byte{'\n'}) + 1
	labels := bytes.Count(text, []byte{'=', '"'})
	fams := min(lines, 16)
	a.strs.reserve(2*labels + 2*fams)
	a.floats.reserve(lines)
	a.labels.reserve(labels)
	a.metrics.reserve(lines)
	a.families.reserve(fams)
	a.gauges.reserve(lines)
	a.counters.reserve(lines)
	a.untyped.reserve(lines)
	if cap(a.lps)-len(a.lps) < labels {
		a.lps = make([]*dto.LabelPair, 0, labels)
	}
}

// reset drops every reference handed out, keeping the memory. Nothing
// from a readFamilies call may be used after it.
func (a *fastArena) reset() {
	a.strs.reset()
	a.floats.reset()
	a.labels.reset()
	a.metrics.reset()
	a.families.reset()
	a.gauges.reset()
	a.counters.reset()
	a.untyped.reset()
	clear(a.lps)
	a.lps = a.lps[:0]
	clear(a.fams)
	clear(a.seenHelp)
}

// pooled reports whether a is small enough to keep for the next scrape:
// one hostile body must not pin its memory in the pool.
func (a *fastArena) pooled() bool {
	return cap(a.metrics.buf) <= 4096 && cap(a.lps) <= 16384 && len(a.fams) <= 64
}

var arenaPool = sync.Pool{New: func() any { return new(fastArena) }}

func (a *fastArena) str(s string) *string {
	p := a.strs.next()
	*p = s
	return p
}

func (a *fastArena) family(name string) *dto.MetricFamily {
	f := a.families.next()
	f.Name = a.str(name)
	return f
}
