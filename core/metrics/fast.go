package metrics

import (
	"bytes"
	"strconv"

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
	fams := make(map[string]*dto.MetricFamily, 12)
	var cur *dto.MetricFamily
	seenHelp := map[string]bool{}
	for len(text) > 0 {
		var line []byte
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			line, text = text, nil
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
				f = &dto.MetricFamily{Name: strPtr(string(name))}
				fams[*f.Name] = f
			}
			cur = f
			switch string(kw) {
			case "HELP":
				if seenHelp[*f.Name] {
					return nil, false
				}
				seenHelp[*f.Name] = true
				f.Help = strPtr(string(trimBlank(rest)))
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
			f = &dto.MetricFamily{Name: strPtr(string(name))}
			fams[*f.Name] = f
		}
		cur = f
		m := &dto.Metric{}
		if len(rest) > 0 && rest[0] == '{' {
			var okL bool
			if m.Label, rest, okL = fastLabels(rest); !okL {
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
		v, err := strconv.ParseFloat(string(val), 64)
		if err != nil {
			return nil, false
		}
		switch {
		case f.Type == nil:
			t := dto.MetricType_UNTYPED
			f.Type = &t
			m.Untyped = &dto.Untyped{Value: &v}
		case *f.Type == dto.MetricType_GAUGE:
			m.Gauge = &dto.Gauge{Value: &v}
		case *f.Type == dto.MetricType_COUNTER:
			m.Counter = &dto.Counter{Value: &v}
		default:
			m.Untyped = &dto.Untyped{Value: &v}
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
// returns the pairs and the rest of the line.
func fastLabels(s []byte) ([]*dto.LabelPair, []byte, bool) {
	s = s[1:]
	var out []*dto.LabelPair
	for {
		if len(s) > 0 && s[0] == '}' {
			return out, s[1:], true
		}
		n := 0
		for n < len(s) && (s[n] == '_' || (s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') || (n > 0 && s[n] >= '0' && s[n] <= '9')) {
			n++
		}
		if n == 0 || n+1 >= len(s) || s[n] != '=' || s[n+1] != '"' {
			return nil, nil, false
		}
		name := string(s[:n])
		if len(name) >= 2 && name[:2] == "__" {
			return nil, nil, false // reserved names: expfmt's rules
		}
		s = s[n+2:]
		end := bytes.IndexByte(s, '"')
		if end < 0 || bytes.IndexByte(s[:end], '\\') >= 0 || bytes.IndexByte(s[:end], '\n') >= 0 {
			return nil, nil, false
		}
		for _, l := range out {
			if l.GetName() == name {
				return nil, nil, false
			}
		}
		out = append(out, &dto.LabelPair{Name: strPtr(name), Value: strPtr(string(s[:end]))})
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

func strPtr(s string) *string { return &s }
