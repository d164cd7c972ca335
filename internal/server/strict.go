package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf16"
)

// checkStrict holds a JSON body, already decoded into a value of type t by
// encoding/json, to what encoding/json lets pass but the contract does not: a member
// that appears twice (encoding/json keeps the last), a member named in another case
// than the contract's (encoding/json matches names case-insensitively), and a \u
// escape that is half a surrogate pair (encoding/json turns it into U+FFFD, so two
// different keys would name one record). It walks the tokens alongside t.
func checkStrict(body []byte, t reflect.Type) error {
	w := &strictWalker{body: body}
	if err := w.value(t, "", 0); err != errMalformed {
		return err
	}
	return nil
}

// errMalformed stops the walk at JSON that is not well formed; encoding/json, which
// decodes the body after the walk, explains what is wrong with it.
var errMalformed = errors.New("malformed JSON")

// maxDepth bounds the nesting the walk follows, as encoding/json bounds its own.
const maxDepth = 10000

// strictWalker scans the body's bytes once, without building tokens: it looks only at
// the structure, the member names and the escapes in strings.
type strictWalker struct {
	body []byte
	at   int
}

func (w *strictWalker) space() {
	for w.at < len(w.body) {
		switch w.body[w.at] {
		case ' ', '\t', '\r', '\n':
			w.at++
		default:
			return
		}
	}
}

// next skips whitespace and returns the next byte without consuming it, or 0 at the end.
func (w *strictWalker) next() byte {
	w.space()
	if w.at >= len(w.body) {
		return 0
	}
	return w.body[w.at]
}

// str consumes a string, the walker standing on its opening quote, and returns its
// raw text, quotes included.
func (w *strictWalker) str() ([]byte, error) {
	start := w.at
	for w.at++; w.at < len(w.body); w.at++ {
		switch w.body[w.at] {
		case '\\':
			w.at++
		case '"':
			w.at++
			return w.body[start:w.at], nil
		}
	}
	return nil, errMalformed
}

func (w *strictWalker) value(t reflect.Type, path string, depth int) error {
	if depth > maxDepth {
		return errMalformed
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch w.next() {
	case 0:
		return errMalformed
	case '{':
		w.at++
		return w.object(t, path, depth)
	case '[':
		w.at++
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		if w.next() == ']' {
			w.at++
			return nil
		}
		for i := 0; ; i++ {
			if err := w.value(elem, path+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
				return err
			}
			switch w.next() {
			case ',':
				w.at++
			case ']':
				w.at++
				return nil
			default:
				return errMalformed
			}
		}
	case '"':
		raw, err := w.str()
		if err != nil {
			return err
		}
		if loneSurrogate(raw) {
			return invalid("%q holds a \\u escape that is half of a UTF-16 surrogate pair; strings must be Unicode text", path)
		}
		return nil
	}
	// A number, true, false or null: its bytes run to the next delimiter.
	for w.at < len(w.body) {
		switch w.body[w.at] {
		case ',', ']', '}', ' ', '\t', '\r', '\n':
			return nil
		}
		w.at++
	}
	return nil
}

func (w *strictWalker) object(t reflect.Type, path string, depth int) error {
	if w.next() == '}' {
		w.at++
		return nil
	}
	var seen map[string]bool
	for {
		if w.next() != '"' {
			return errMalformed
		}
		raw, err := w.str()
		if err != nil {
			return err
		}
		name, err := memberName(raw)
		if err != nil {
			return err
		}
		member := join(path, name)
		if loneSurrogate(raw) {
			return invalid("member %s holds a \\u escape that is half of a UTF-16 surrogate pair", raw)
		}
		if seen == nil {
			seen = make(map[string]bool)
		}
		if seen[name] {
			return invalid("member %q appears twice; each member may appear once", member)
		}
		seen[name] = true
		var elem reflect.Type
		if t != nil {
			switch t.Kind() {
			case reflect.Map:
				elem = t.Elem()
			case reflect.Struct:
				field, exact, ok := fieldByName(t, name)
				if !ok {
					return invalid("unknown field %q", member)
				}
				if !exact {
					return invalid("member %q is not in the contract; member names are case-sensitive: %q", member, join(path, field.name))
				}
				elem = field.typ
			}
		}
		if w.next() != ':' {
			return errMalformed
		}
		w.at++
		if err := w.value(elem, member, depth+1); err != nil {
			return err
		}
		switch w.next() {
		case ',':
			w.at++
		case '}':
			w.at++
			return nil
		default:
			return errMalformed
		}
	}
}

// memberName is a member name's text: its raw bytes when it has no escapes, as almost
// every name has none.
func memberName(raw []byte) (string, error) {
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner), nil
	}
	var name string
	if err := json.Unmarshal(raw, &name); err != nil {
		return "", errMalformed
	}
	return name, nil
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

type jsonField struct {
	name string
	typ  reflect.Type
}

// fieldByName finds the struct field a member name decodes into as encoding/json
// would (exact match first, then case-insensitive), and says whether it matched
// exactly.
func fieldByName(t reflect.Type, name string) (jsonField, bool, bool) {
	var folded jsonField
	found := false
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" {
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		if tag == name {
			return jsonField{tag, f.Type}, true, true
		}
		if !found && strings.EqualFold(tag, name) {
			folded, found = jsonField{tag, f.Type}, true
		}
	}
	return folded, false, found
}

// loneSurrogate reports whether the raw text of a JSON string holds a \u escape of a
// surrogate that is not part of a high-low pair.
func loneSurrogate(raw []byte) bool {
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if i+1 >= len(raw) || raw[i+1] != 'u' {
			i++ // an escaped character, such as \\ or \"
			continue
		}
		r, ok := hex4(raw, i+2)
		if !ok || !utf16.IsSurrogate(r) {
			i += 5
			continue
		}
		if r >= 0xDC00 {
			return true // a low surrogate with no high one before it
		}
		if i+11 >= len(raw) || raw[i+6] != '\\' || raw[i+7] != 'u' {
			return true
		}
		low, ok := hex4(raw, i+8)
		if !ok || low < 0xDC00 || low > 0xDFFF {
			return true
		}
		i += 11
	}
	return false
}

func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[at:at+4]), 16, 32)
	return rune(n), err == nil
}
