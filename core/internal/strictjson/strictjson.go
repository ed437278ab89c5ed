// Package strictjson decodes configuration JSON strictly and names the key
// at fault: an unknown key or a value of the wrong type becomes a *KeyError
// whose Key is the path from the document's root ("index.max_entries",
// "strategies[1].weight", `servers["a:1"].block_size`). The C ABI passes
// that path to the caller, which maps it back onto the key the user wrote.
package strictjson

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

	json "github.com/goccy/go-json"
)

// KeyError is a configuration error at one key path ("" = the document).
type KeyError struct {
	Key string
	Msg string
}

func (e *KeyError) Error() string {
	if e.Key == "" {
		return e.Msg
	}
	return e.Key + ": " + e.Msg
}

// Errorf builds a *KeyError.
func Errorf(key, format string, args ...any) *KeyError {
	return &KeyError{Key: key, Msg: fmt.Sprintf(format, args...)}
}

// Join appends key to the path prefix ("a" + "b" = "a.b"; "a" + "[0]" = "a[0]").
func Join(prefix, key string) string {
	switch {
	case prefix == "":
		return key
	case key == "":
		return prefix
	case strings.HasPrefix(key, "["):
		return prefix + key
	}
	return prefix + "." + key
}

// Prefixed re-roots err under prefix when it is a *KeyError (see Join);
// other errors come back unchanged.
func Prefixed(prefix string, err error) error {
	var ke *KeyError
	if errors.As(err, &ke) {
		return &KeyError{Key: Join(prefix, ke.Key), Msg: ke.Msg}
	}
	return err
}

var rawType = reflect.TypeOf(json.RawMessage(nil))

// Decode unmarshals one JSON value into v (a pointer), rejecting unknown
// object keys, values of the wrong type and trailing data, each as a
// *KeyError naming the key.
func Decode(data []byte, v any) error {
	if key, allowed, ok := unknownKey(data, reflect.TypeOf(v).Elem(), ""); ok {
		return Errorf(key, "unknown key (allowed here: %s)", strings.Join(allowed, ", "))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Errorf(fieldPath(reflect.TypeOf(v), te.Field), "must be %s, got %s", typeName(te.Type), te.Value)
		}
		return Errorf("", "invalid JSON: %v", err)
	}
	if dec.More() {
		return Errorf("", "invalid JSON: trailing data after the value")
	}
	return nil
}

// unknownKey walks the document alongside t and reports the first object
// key (in sorted order, so the error is stable) that t has no field for.
// Malformed JSON is left to the decoder's own error.
func unknownKey(data []byte, t reflect.Type, path string) (string, []string, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawType {
		return "", nil, false
	}
	switch t.Kind() {
	case reflect.Struct:
		var m map[string]json.RawMessage
		if json.Unmarshal(data, &m) != nil {
			return "", nil, false
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			f, ok := fields[k]
			if !ok {
				allowed := make([]string, 0, len(fields))
				for name := range fields {
					allowed = append(allowed, name)
				}
				sort.Strings(allowed)
				return Join(path, k), allowed, true
			}
			if key, allowed, bad := unknownKey(m[k], f, Join(path, k)); bad {
				return key, allowed, true
			}
		}
	case reflect.Map:
		var m map[string]json.RawMessage
		if json.Unmarshal(data, &m) != nil {
			return "", nil, false
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if key, allowed, bad := unknownKey(m[k], t.Elem(), path+"["+strconv.Quote(k)+"]"); bad {
				return key, allowed, true
			}
		}
	case reflect.Slice, reflect.Array:
		var a []json.RawMessage
		if json.Unmarshal(data, &a) != nil {
			return "", nil, false
		}
		for i, e := range a {
			if key, allowed, bad := unknownKey(e, t.Elem(), path+"["+strconv.Itoa(i)+"]"); bad {
				return key, allowed, true
			}
		}
	}
	return "", nil, false
}

// jsonFields maps a struct's JSON keys to their field types (embedded
// structs' fields included, `json:"-"` and unexported fields excluded).
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// fieldPath turns the decoder's dotted field path ("strategies.1.weight",
// "servers.a:1.capacity") into this package's form ("strategies[1].weight",
// `servers["a:1"].capacity`), walking t to tell map keys from fields.
func fieldPath(t reflect.Type, field string) string {
	var b strings.Builder
	for _, part := range strings.Split(field, ".") {
		if part == "" {
			continue
		}
		for t != nil && t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		kind := reflect.Invalid
		if t != nil {
			kind = t.Kind()
		}
		switch kind {
		case reflect.Map:
			b.WriteString("[" + strconv.Quote(part) + "]")
			t = t.Elem()
			continue
		case reflect.Slice, reflect.Array:
			b.WriteString("[" + part + "]")
			t = t.Elem()
			continue
		case reflect.Struct:
			t = jsonFields(t)[part]
		default:
			t = nil
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(part)
	}
	return b.String()
}

func typeName(t reflect.Type) string {
	if t == nil {
		return "a value of another type"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "a list"
	}
	return t.String()
}
