package server

import (
	"bytes"
	"encoding/json"
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
	w := &strictWalker{dec: json.NewDecoder(bytes.NewReader(body)), body: body}
	w.dec.UseNumber()
	return w.value(t, "")
}

type strictWalker struct {
	dec  *json.Decoder
	body []byte
	// end is where the previous token ended; the raw text of a token lies between it
	// and the decoder's offset after the token.
	end int64
}

// token reads the next token and returns the raw text it came from.
func (w *strictWalker) token() (json.Token, []byte, error) {
	tok, err := w.dec.Token()
	if err != nil {
		return nil, nil, err
	}
	start, end := w.end, w.dec.InputOffset()
	w.end = end
	return tok, w.body[start:end], nil
}

func (w *strictWalker) value(t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, raw, err := w.token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		return w.object(t, path)
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; w.dec.More(); i++ {
			if err := w.value(elem, path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		_, _, err := w.token()
		return err
	}
	if _, ok := tok.(string); ok && loneSurrogate(raw) {
		return invalid("%q holds a \\u escape that is half of a UTF-16 surrogate pair; strings must be Unicode text", path)
	}
	return nil
}

func (w *strictWalker) object(t reflect.Type, path string) error {
	seen := make(map[string]bool)
	for w.dec.More() {
		tok, raw, err := w.token()
		if err != nil {
			return err
		}
		name, _ := tok.(string)
		member := join(path, name)
		if loneSurrogate(raw) {
			return invalid("member %s holds a \\u escape that is half of a UTF-16 surrogate pair", bytes.TrimLeft(raw, " \t\r\n,{"))
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
		if err := w.value(elem, member); err != nil {
			return err
		}
	}
	_, _, err := w.token()
	return err
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
