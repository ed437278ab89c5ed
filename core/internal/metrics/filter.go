package metrics

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"
	"sync"
)

// A vLLM scrape holds 40-100 families, almost all histograms the router never
// reads; building protobuf families for all of them costs ~14k allocations.
// So before the expfmt parser runs, one pass over the body keeps only the
// lines of the families the flavor reads. Kept lines get full validation
// (fast path or expfmt). Of the other lines:
//   - a sample line of a family declared by HELP/TYPE that the router does
//     not read (the bulk of a scrape: histogram buckets) only has its name
//     scanned, to tell it is not a wanted family. Its labels and value are
//     not checked: a malformed line the router never reads must not cost
//     the router a server's load figures, and checking ~600 such lines
//     per scrape was most of the polling CPU;
//   - any other sample line (outside a declared family, or whose name
//     does not start with it) gets a light check: a valid metric name, a
//     well-formed (quote-aware) label block and a float value, so that an
//     HTML error page or a truncated body is still rejected;
//   - comments are free text.
// Errors name the line of the original body.

var vllmFamilies = set(
	"vllm:num_requests_running",
	"vllm:num_requests_waiting",
	"vllm:kv_cache_usage_perc",
	"vllm:gpu_cache_usage_perc",
	"vllm:prefix_cache_queries_total",
	"vllm:prefix_cache_hits_total",
	"vllm:gpu_prefix_cache_queries_total",
	"vllm:gpu_prefix_cache_hits_total",
	"vllm:external_prefix_cache_queries_total",
	"vllm:external_prefix_cache_hits_total",
	"vllm:cache_config_info",
)

var sglangFamilies = set(
	"sglang:num_running_reqs",
	"sglang:num_queue_reqs",
	"sglang:token_usage",
	"sglang:max_total_num_tokens",
	"sglang:prompt_tokens_total",
	"sglang:cached_tokens_total",
)

func set(names ...string) *familySet {
	fs := &familySet{}
	for _, n := range names {
		if len(n) < len(fs.byLen) {
			fs.byLen[len(n)] = append(fs.byLen[len(n)], n)
			fs.all = append(fs.all, n)
		}
	}
	sort.Strings(fs.all) // for extends' binary search
	return fs
}

// familySet holds the family names a flavor reads, bucketed by length: most
// lines of a scrape (histogram buckets) are ruled out by their name's
// length, the rest by one or two byte comparisons, with no hashing.
type familySet struct {
	byLen [128][]string
	all   []string // sorted
}

// isWanted reports whether name is one of wanted's families.
func isWanted(name []byte, wanted *familySet) bool {
	if len(name) >= len(wanted.byLen) {
		return false
	}
	for _, w := range wanted.byLen[len(name)] {
		if string(name) == w {
			return true
		}
	}
	return false
}

// filtered is the reusable output of filter.
type filtered struct {
	text  []byte
	lines []int // original line number of each kept line
	// family is the valid metric name of the last HELP/TYPE line (empty
	// if none or invalid).
	family []byte
	// familyUnread: family is not one the flavor reads, so its sample
	// lines are skipped unchecked.
	familyUnread bool
	// blockSkip: also no name the flavor reads starts with family, so a
	// line starting with it can be dropped on that prefix alone.
	blockSkip bool
}

// blockSkipOn lets a test compare block skipping with the line-by-line path.
var blockSkipOn = true

// setFamily remembers name as the current family if it is a valid name.
func (f *filtered) setFamily(name []byte, wanted *familySet) {
	if len(f.family) > 0 && bytes.Equal(name, f.family) {
		return // the TYPE line after its HELP line
	}
	f.family, f.familyUnread, f.blockSkip = f.family[:0], false, false
	if len(name) == 0 || nameByte[name[0]] != 1 {
		return
	}
	for _, c := range name[1:] {
		if nameByte[c] == 0 {
			return
		}
	}
	f.family = append(f.family, name...)
	f.familyUnread = len(name) > 0 && !isWanted(name, wanted)
	if f.familyUnread && blockSkipOn && !wanted.extends(name) {
		f.blockSkip = true
	}
}

// extends reports whether some wanted name is longer than prefix and
// starts with it.
func (fs *familySet) extends(prefix []byte) bool {
	// all is sorted: the names starting with prefix directly follow its
	// lower bound.
	lo, hi := 0, len(fs.all)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if fs.all[m] < string(prefix) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	for ; lo < len(fs.all) && len(fs.all[lo]) >= len(prefix) && fs.all[lo][:len(prefix)] == string(prefix); lo++ {
		if len(fs.all[lo]) > len(prefix) {
			return true
		}
	}
	return false
}

// skipBlock skips the run of lines at the start of body that begin with
// the current family's name when that family is unread and no wanted name
// extends it (see blockSkip): the same lines the line-by-line path would
// drop unchecked, but without scanning each name's suffix or calling
// checkLine. It returns the body after the run and the number of lines
// skipped (0: use the line-by-line path).
func (f *filtered) skipBlock(body []byte) ([]byte, int) {
	if !f.blockSkip {
		return body, 0
	}
	n := 0
	for bytes.HasPrefix(body, f.family) {
		n++
		i := bytes.IndexByte(body, '\n')
		if i < 0 {
			return nil, n
		}
		body = body[i+1:]
	}
	return body, n
}

var filterPool = sync.Pool{New: func() any { return new(filtered) }}

// origLine maps a 1-based line of f.text to the body's line number.
func (f *filtered) origLine(n int) int {
	switch {
	case len(f.lines) == 0:
		return n
	case n < 1:
		return f.lines[0]
	case n > len(f.lines):
		return f.lines[len(f.lines)-1]
	}
	return f.lines[n-1]
}

func (f *filtered) filter(body []byte, wanted *familySet) error {
	f.text, f.lines, f.family, f.familyUnread, f.blockSkip = f.text[:0], f.lines[:0], f.family[:0], false, false
	for ln := 1; len(body) > 0; ln++ {
		if rest, n := f.skipBlock(body); n > 0 {
			body, ln = rest, ln+n-1
			continue
		}
		var line []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			line, body = body, nil
		}
		line = trimBlank(line)
		if len(line) == 0 {
			continue
		}
		keep, err := f.checkLine(line, wanted)
		if err != nil {
			return fmt.Errorf("%w: line %d: %s", ErrMalformed, ln, err)
		}
		if keep {
			f.text = append(append(f.text, line...), '\n')
			f.lines = append(f.lines, ln)
		}
	}
	return nil
}

// checkLine validates one non-blank line and reports whether to keep it.
func (f *filtered) checkLine(line []byte, wanted *familySet) (bool, error) {
	if line[0] == '#' {
		// "# HELP name ..." / "# TYPE name type"; anything else is a comment
		// (including OpenMetrics "# EOF" and "# UNIT").
		var kw, rest []byte
		if len(line) > 7 && line[1] == ' ' && line[6] == ' ' && (string(line[2:6]) == "HELP" || string(line[2:6]) == "TYPE") {
			// The canonical spelling, split without the word scanner.
			kw, rest = line[2:6], line[6:]
			// The TYPE line after its family's HELP line (or the
			// reverse) names the current family again: setFamily would
			// change nothing, and a family the flavor does not read
			// keeps nothing.
			if fam := f.family; f.familyUnread && bytes.HasPrefix(rest[1:], fam) && (len(rest) == 1+len(fam) || rest[1+len(fam)] == ' ') {
				return false, nil
			}
		} else {
			kw, rest = word(line[1:])
		}
		if string(kw) != "HELP" && string(kw) != "TYPE" {
			return false, nil
		}
		name, rest := word(rest)
		f.setFamily(name, wanted)
		if !isWanted(name, wanted) {
			return false, nil
		}
		if string(kw) == "TYPE" {
			typ, _ := word(rest)
			switch string(typ) {
			case "info", "stateset", "gaugehistogram", "unknown":
				return false, nil // OpenMetrics-only types: read samples as untyped
			}
		}
		return true, nil
	}
	n, inFamily := 0, false
	if len(f.family) > 0 && bytes.HasPrefix(line, f.family) {
		// The family's sample lines repeat its (already checked) name:
		// only the suffix (_bucket, _sum, ...) needs scanning.
		n, inFamily = len(f.family), true
	}
	for n < len(line) && isNameByte(line[n], n == 0) {
		n++
	}
	if n == 0 {
		return false, fmt.Errorf("invalid metric name at %q", clip(line))
	}
	name, rest := line[:n], line[n:]
	if isWanted(name, wanted) {
		return true, nil // fully parsed and validated later
	}
	if inFamily && f.familyUnread {
		return false, nil // a line of a family the router does not read
	}
	if len(rest) > 0 && rest[0] == '{' {
		end := labelsEnd(rest)
		if end < 0 {
			return false, fmt.Errorf("unterminated label set in %q", clip(line))
		}
		rest = rest[end+1:]
	}
	trimmed := trimBlank(rest)
	if len(trimmed) == len(rest) || len(trimmed) == 0 {
		return false, fmt.Errorf("expected value after metric name in %q", clip(line))
	}
	val := trimmed
	if i := blankIndex(val); i >= 0 {
		val = val[:i]
	}
	if plainFloat(val) {
		return false, nil
	}
	if _, err := strconv.ParseFloat(string(val), 64); err != nil {
		return false, fmt.Errorf("expected float as value, got %q", clip(val))
	}
	return false, nil
}

func isNameByte(c byte, first bool) bool {
	return nameByte[c] == 1 || (!first && nameByte[c] == 2)
}

// nameByte classifies metric-name bytes: 1 anywhere, 2 not first.
var nameByte = func() (t [256]uint8) {
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = 1, 1
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = 2
	}
	t['_'], t[':'] = 1, 1
	return t
}()

// labelsEnd returns the index of the '}' closing the label set that starts
// at s[0] == '{', honouring quoted values with backslash escapes; -1 if none.
func labelsEnd(s []byte) int {
	// Fast path: the first '}' closes the set when no backslash precedes
	// it and the quotes before it pair up (three vectorised scans instead
	// of a byte loop over every label).
	if c := bytes.IndexByte(s, '}'); c >= 0 {
		seg := s[:c]
		if bytes.IndexByte(seg, '\\') < 0 && bytes.Count(seg, []byte{'"'})%2 == 0 {
			return c
		}
	}
	return labelsEndSlow(s)
}

// labelsEndSlow is the plain quote-aware scan; the fast path above must
// agree with it (TestLabelsEndFastPathAgrees).
func labelsEndSlow(s []byte) int {
	inQuote := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return i
		}
	}
	return -1
}

func clip(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "..."
	}
	return string(b)
}

// word skips blanks and returns the next blank-delimited word and the rest.
func word(s []byte) (w, rest []byte) {
	s = trimBlank(s)
	i := blankIndex(s)
	if i < 0 {
		return s, nil
	}
	return s[:i], s[i:]
}

// plainFloat is an allocation-free fast path for the common decimal forms
// ("12", "0.25", "1.789e+09", "NaN", "+Inf"); false means "ask strconv".
func plainFloat(s []byte) bool {
	switch string(s) {
	case "NaN", "+Inf", "-Inf", "Inf":
		return true
	}
	digits, dot, exp := 0, false, false
	for i, c := range s {
		switch {
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && !dot && !exp:
			dot = true
		case (c == 'e' || c == 'E') && !exp && digits > 0:
			exp = true
			digits = 0
		case (c == '+' || c == '-') && (i == 0 || s[i-1] == 'e' || s[i-1] == 'E'):
		default:
			return false
		}
	}
	return digits > 0
}

func trimBlank(s []byte) []byte {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	return s
}

// blankIndex is the index of the first space or tab in s, or -1. Two
// vectorised scans beat a byte loop over the 30-40 byte names of HELP and
// TYPE lines.
func blankIndex(s []byte) int {
	i := bytes.IndexByte(s, ' ')
	head := s
	if i >= 0 {
		head = s[:i]
	}
	if j := bytes.IndexByte(head, '\t'); j >= 0 {
		return j
	}
	return i
}
