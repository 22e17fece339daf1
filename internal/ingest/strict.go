package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Strict JSON: every JSON body the API reads (the admin PATCH and PUT
// bodies, a batch and its items) goes through decodeStrict, which refuses
// what encoding/json lets through: a key given twice (encoding/json keeps
// the last), a key that names a field in another case (encoding/json
// matches case-insensitively), an unknown key, data after the value and a
// string that is not valid UTF-8 (encoding/json puts U+FFFD in its place).
// A payload (a json.RawMessage, or any value whose type decodes itself) is
// the client's: it is only checked to be JSON in valid UTF-8.

// ErrStrictJSON classifies every refusal of decodeStrict; the error is a
// *JSONError, which says where.
var ErrStrictJSON = errors.New("the body is not strict JSON")

// What a *JSONError found.
const (
	jsonSyntax    = "not valid JSON"
	jsonUnknown   = "unknown field"
	jsonDuplicate = "duplicate field"
	jsonMiscased  = "miscased field"
	jsonTrailing  = "data after the JSON value"
	jsonUTF8      = "not valid UTF-8"
	jsonType      = "wrong type"
)

// JSONError is a refusal of decodeStrict: what is wrong (Reason, one of
// the json* constants), where (Pointer, an RFC 6901 JSON pointer; "" is
// the whole body), the key as sent for a key's fault, and the cause from
// encoding/json when there is one. It matches ErrStrictJSON and unwraps to
// its cause.
type JSONError struct {
	Reason  string
	Pointer string
	Key     string
	// Want, for a miscased key, is the field's spelling.
	Want string
	Err  error
}

func (e *JSONError) Error() string {
	at := ""
	if e.Pointer != "" {
		at = " at " + clip(e.Pointer)
	}
	switch e.Reason {
	case jsonUnknown:
		// encoding/json's wording, which the admin bodies always answered.
		return fmt.Sprintf("json: unknown field %q", clip(e.Key))
	case jsonDuplicate:
		return fmt.Sprintf("json: field %q is given twice", clip(e.Key))
	case jsonMiscased:
		return fmt.Sprintf("json: field %q is spelled %q: names are case-sensitive", clip(e.Key), e.Want)
	case jsonTrailing, jsonUTF8:
		return "json: " + e.Reason + at
	}
	if e.Err != nil {
		return e.Err.Error()
	}
	return "json: " + e.Reason + at
}

// Unwrap makes errors.Is(err, ErrStrictJSON) true and keeps the cause.
func (e *JSONError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrStrictJSON}
	}
	return []error{ErrStrictJSON, e.Err}
}

// decodeStrict decodes the JSON value in data into v (a pointer), refusing
// with a *JSONError what is not strict JSON for v's type. Errors of a
// value that decodes itself (a bucket.Rate) come back as that value made
// them, so that they keep their meaning (bucket.ErrInvalidRate).
func decodeStrict(data []byte, v any) error {
	t := reflect.TypeOf(v)
	if t == nil || t.Kind() != reflect.Pointer {
		return errors.New("ingest: decodeStrict needs a pointer")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	w := strictWalker{dec: dec, data: data}
	if err := w.value(t.Elem(), ""); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return &JSONError{Reason: jsonTrailing}
	}
	dec = json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var ute *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &ute):
			p := ""
			if ute.Field != "" {
				p = "/" + strings.ReplaceAll(ute.Field, ".", "/")
			}
			return &JSONError{Reason: jsonType, Pointer: p, Err: err}
		case errors.As(err, &se):
			return &JSONError{Reason: jsonSyntax, Err: err}
		}
		return err
	}
	return nil
}

// strictWalker reads a JSON value token by token against the Go type it
// is for.
type strictWalker struct {
	dec  *json.Decoder
	data []byte
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// free reports whether a value of type t is the client's own JSON: any
// JSON goes (an interface, a type that decodes itself, or no Go type at
// all because it does not match: encoding/json then names the type error).
func free(t reflect.Type) bool {
	return t == nil || t.Kind() == reflect.Interface || t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType)
}

func (w *strictWalker) value(t reflect.Type, ptr string) error {
	for t != nil && t.Kind() == reflect.Pointer && !free(t) {
		t = t.Elem()
	}
	if free(t) {
		var raw json.RawMessage
		if err := w.dec.Decode(&raw); err != nil {
			return w.syntax(ptr, err)
		}
		if !utf8.Valid(raw) {
			return &JSONError{Reason: jsonUTF8, Pointer: ptr}
		}
		return nil
	}
	start := w.dec.InputOffset()
	tok, err := w.dec.Token()
	if err != nil {
		return w.syntax(ptr, err)
	}
	switch tok {
	case json.Delim('{'):
		return w.object(t, ptr)
	case json.Delim('['):
		var elem reflect.Type
		if k := t.Kind(); k == reflect.Slice || k == reflect.Array {
			elem = t.Elem()
		}
		for i := 0; w.dec.More(); i++ {
			if err := w.value(elem, ptr+"/"+strconv.Itoa(i)); err != nil {
				return err
			}
		}
		if _, err := w.dec.Token(); err != nil {
			return w.syntax(ptr, err)
		}
	default:
		if _, ok := tok.(string); ok && !utf8.Valid(w.data[start:w.dec.InputOffset()]) {
			return &JSONError{Reason: jsonUTF8, Pointer: ptr}
		}
	}
	return nil
}

// object reads the members of an object (its '{' read) of type t: a
// struct's keys must be its fields' names exactly, each at most once; a
// map's keys may be anything, once.
func (w *strictWalker) object(t reflect.Type, ptr string) error {
	var fields map[string]reflect.Type
	var elem reflect.Type
	switch t.Kind() {
	case reflect.Struct:
		fields = fieldsOf(t)
	case reflect.Map:
		elem = t.Elem()
	}
	seen := map[string]bool{}
	for w.dec.More() {
		start := w.dec.InputOffset()
		tok, err := w.dec.Token()
		if err != nil {
			return w.syntax(ptr, err)
		}
		key, _ := tok.(string) // More said a member follows: a key
		at := ptr + "/" + pointerEscape(key)
		if !utf8.Valid(w.data[start:w.dec.InputOffset()]) {
			return &JSONError{Reason: jsonUTF8, Pointer: at, Key: key}
		}
		if seen[key] {
			return &JSONError{Reason: jsonDuplicate, Pointer: at, Key: key}
		}
		seen[key] = true
		ft := elem
		if fields != nil {
			var ok bool
			if ft, ok = fields[key]; !ok {
				for name := range fields {
					if strings.EqualFold(name, key) {
						return &JSONError{Reason: jsonMiscased, Pointer: at, Key: key, Want: name}
					}
				}
				return &JSONError{Reason: jsonUnknown, Pointer: at, Key: key}
			}
		}
		if err := w.value(ft, at); err != nil {
			return err
		}
	}
	if _, err := w.dec.Token(); err != nil {
		return w.syntax(ptr, err)
	}
	return nil
}

func (w *strictWalker) syntax(ptr string, err error) error {
	return &JSONError{Reason: jsonSyntax, Pointer: ptr, Err: err}
}

// structFields caches fieldsOf by type.
var structFields sync.Map // reflect.Type → map[string]reflect.Type

// fieldsOf maps the JSON names of a struct's exported fields to their
// types, as encoding/json names them (the tag's name, else the Go name;
// "-" left out). Embedded structs are not used by the API's bodies.
func fieldsOf(t reflect.Type) map[string]reflect.Type {
	if m, ok := structFields.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		m[name] = f.Type
	}
	structFields.Store(t, m)
	return m
}

// pointerEscape escapes a key for a JSON pointer (RFC 6901).
func pointerEscape(key string) string {
	if !strings.ContainsAny(key, "~/") {
		return key
	}
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
}
