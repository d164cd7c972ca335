package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
)

// checkStrict holds a JSON body, already decoded into a value of type t by
// encoding/json, to what encoding/json lets pass but the contract does not: a member
// that appears twice (encoding/json keeps the last), a member named in another case
// than the contract's (encoding/json matches names case-insensitively), and a \u
// escape that is half a surrogate pair (encoding/json turns it into U+FFFD, so two
// different keys would name one record), and a null (encoding/json takes it for an
// absent member). It walks the tokens alongside t.
func checkStrict(body []byte, t reflect.Type) error {
	w := &strictWalker{body: body}
	if err := w.value(t, 0); err != errMalformed {
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
// the structure, the member names and the escapes in strings. It allocates next to
// nothing on a valid body: the path of the value it stands on is kept as steps and
// spelled out only for an error.
type strictWalker struct {
	body []byte
	at   int
	path []pathStep
}

// pathStep is a member's name, or an array's index when name is nil.
type pathStep struct {
	name  []byte
	index int
}

// where spells out the path of the value the walker stands on, "items[3].claim.key".
func (w *strictWalker) where() string {
	var b strings.Builder
	for _, s := range w.path {
		if s.name == nil {
			b.WriteString("[" + strconv.Itoa(s.index) + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.Write(s.name)
	}
	return b.String()
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

func (w *strictWalker) value(t reflect.Type, depth int) error {
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
		return w.object(t, depth)
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
			w.path = append(w.path, pathStep{index: i})
			err := w.value(elem, depth+1)
			w.path = w.path[:len(w.path)-1]
			if err != nil {
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
			return invalid("%q holds a \\u escape that is half of a UTF-16 surrogate pair; strings must be Unicode text", w.where())
		}
		return nil
	}
	// A number, true, false or null: its bytes run to the next delimiter. Whether
	// they spell a valid literal is left to encoding/json; the walk goes on past a
	// malformed one, as it would past a malformed number.
	start := w.at
	for w.at < len(w.body) {
		switch w.body[w.at] {
		case ',', ']', '}', ' ', '\t', '\r', '\n':
			return w.null(w.body[start:w.at], depth)
		}
		w.at++
	}
	return w.null(w.body[start:w.at], depth)
}

// null refuses word, a literal just walked, if it is a null: encoding/json reads a null
// as if the member were absent, but the contract allows null nowhere, so a null member is
// a mistake to point out, not a default. A word is a null only when it is the four
// letters and what follows them (past any space) may follow a value: a comma or a
// bracket inside an object or an array, the body's end where the null is the whole body.
// Anything else, "nullx" or a body cut short after a null, is malformed JSON, which
// encoding/json explains.
func (w *strictWalker) null(word []byte, depth int) error {
	if string(word) != "null" {
		return nil
	}
	switch next := w.next(); {
	case depth == 0 && next == 0:
		return invalid("request body is null; send a JSON object")
	case depth > 0 && (next == ',' || next == ']' || next == '}'):
		return invalid("%q is null; the contract allows no null: leave the member out to take its default", w.where())
	}
	return errMalformed
}

// object walks an object's members. Each may appear once: a struct's are told apart
// by field index, any other object's by name (a few compared in place, more in a map).
func (w *strictWalker) object(t reflect.Type, depth int) error {
	if w.next() == '}' {
		w.at++
		return nil
	}
	var fields *structFields
	if t != nil && t.Kind() == reflect.Struct {
		fields = fieldsOf(t)
	}
	var (
		seenFields uint64
		seenNames  [][]byte
		seenMap    map[string]bool
	)
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
		w.path = append(w.path, pathStep{name: name})
		if loneSurrogate(raw) {
			return invalid("member %s holds a \\u escape that is half of a UTF-16 surrogate pair", raw)
		}
		var elem reflect.Type
		switch {
		case fields != nil:
			i, exact, ok := fields.lookup(name)
			if !ok {
				return invalid("unknown field %q", w.where())
			}
			if !exact {
				member := w.where()
				w.path[len(w.path)-1].name = []byte(fields.list[i].name)
				return invalid("member %q is not in the contract; member names are case-sensitive: %q", member, w.where())
			}
			if i < 64 && seenFields&(1<<i) != 0 || i >= 64 && seenMap[fields.list[i].name] {
				return invalid("member %q appears twice; each member may appear once", w.where())
			}
			if i < 64 {
				seenFields |= 1 << i
			} else {
				if seenMap == nil {
					seenMap = make(map[string]bool)
				}
				seenMap[fields.list[i].name] = true
			}
			elem = fields.list[i].typ
		default:
			if t != nil && t.Kind() == reflect.Map {
				elem = t.Elem()
			}
			twice := seenMap[string(name)]
			for _, n := range seenNames {
				twice = twice || bytes.Equal(n, name)
			}
			if twice {
				return invalid("member %q appears twice; each member may appear once", w.where())
			}
			if seenMap == nil && len(seenNames) < 16 {
				seenNames = append(seenNames, name)
			} else {
				if seenMap == nil {
					seenMap = make(map[string]bool)
					for _, n := range seenNames {
						seenMap[string(n)] = true
					}
					seenNames = nil
				}
				seenMap[string(name)] = true
			}
		}
		if w.next() != ':' {
			return errMalformed
		}
		w.at++
		err = w.value(elem, depth+1)
		w.path = w.path[:len(w.path)-1]
		if err != nil {
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
func memberName(raw []byte) ([]byte, error) {
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return inner, nil
	}
	var name string
	if err := json.Unmarshal(raw, &name); err != nil {
		return nil, errMalformed
	}
	return []byte(name), nil
}

type jsonField struct {
	name string
	typ  reflect.Type
}

// structFields are the members a struct type decodes, as encoding/json names them.
type structFields struct {
	list   []jsonField
	byName map[string]int
}

var structFieldsCache sync.Map // reflect.Type → *structFields

func fieldsOf(t reflect.Type) *structFields {
	if f, ok := structFieldsCache.Load(t); ok {
		return f.(*structFields)
	}
	f := &structFields{byName: make(map[string]int)}
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		tag, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if tag == "-" {
			continue
		}
		if tag == "" {
			tag = sf.Name
		}
		f.byName[tag] = len(f.list)
		f.list = append(f.list, jsonField{tag, sf.Type})
	}
	structFieldsCache.Store(t, f)
	return f
}

// lookup finds the field a member name decodes into as encoding/json would (exact
// match first, then case-insensitive), and says whether it matched exactly.
func (f *structFields) lookup(name []byte) (int, bool, bool) {
	if i, ok := f.byName[string(name)]; ok {
		return i, true, true
	}
	for i, field := range f.list {
		if strings.EqualFold(field.name, string(name)) {
			return i, false, true
		}
	}
	return 0, false, false
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
