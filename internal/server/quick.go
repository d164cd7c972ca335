package server

import (
	"encoding/base64"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/idemd/idemd/internal/api"
)

// quickDecode decodes the bodies of the operations every caller makes (claim,
// complete, release, extend, and a batch of them) without reflection, which is most of what the strict
// decoder costs a request. It takes only a body that the strict path (checkStrict and
// encoding/json, in decodeStrict) would take, into the same value; at anything else
// (an unknown, misnamed or repeated member, a null, a type other than the contract's,
// an escape it does not know, malformed JSON) it gives up and returns false, leaving
// v as it was, and the strict path decodes the body and says what is wrong with it.
// body must be valid UTF-8. FuzzQuickDecode holds the two paths to the same answers.
func quickDecode(body []byte, v any) bool {
	d := quick{b: body}
	switch v := v.(type) {
	case *api.ClaimRequest:
		var r api.ClaimRequest
		if d.claim(&r) && d.end() {
			*v = r
			return true
		}
	case *api.CompleteRequest:
		var r api.CompleteRequest
		if d.complete(&r) && d.end() {
			*v = r
			return true
		}
	case *api.ReleaseRequest:
		var r api.ReleaseRequest
		if d.release(&r) && d.end() {
			*v = r
			return true
		}
	case *api.ExtendRequest:
		var r api.ExtendRequest
		if d.extend(&r) && d.end() {
			*v = r
			return true
		}
	case *api.BatchRequest:
		var r api.BatchRequest
		if d.batch(&r) && d.end() {
			*v = r
			return true
		}
	}
	return false
}

// quick reads a JSON body from its start; each method consumes what it recognises
// and returns false at anything else.
type quick struct {
	b  []byte
	at int
}

func (d *quick) space() {
	for d.at < len(d.b) {
		switch d.b[d.at] {
		case ' ', '\t', '\r', '\n':
			d.at++
		default:
			return
		}
	}
}

// byte consumes c, after any whitespace.
func (d *quick) byte(c byte) bool {
	d.space()
	if d.at < len(d.b) && d.b[d.at] == c {
		d.at++
		return true
	}
	return false
}

// end says whether nothing but whitespace is left.
func (d *quick) end() bool {
	d.space()
	return d.at == len(d.b)
}

// open consumes an object's '{' and says whether members follow; an empty object's
// '}' is consumed with it.
func (d *quick) open() (members, ok bool) {
	if !d.byte('{') {
		return false, false
	}
	if d.byte('}') {
		return false, true
	}
	return true, true
}

// name consumes a member's name and its colon. A name with an escape is left to the
// strict path, which explains a name misspelt by one.
func (d *quick) name() ([]byte, bool) {
	raw, escaped, ok := d.raw()
	if !ok || escaped || !d.byte(':') {
		return nil, false
	}
	return raw, true
}

// more consumes the ',' between two members (true) or the '}' after the last (false).
func (d *quick) more() (more, ok bool) {
	if d.byte(',') {
		return true, true
	}
	return false, d.byte('}')
}

// once marks a member seen, and says false if it was already.
func once(seen *uint32, bit uint32) bool {
	if *seen&bit != 0 {
		return false
	}
	*seen |= bit
	return true
}

// raw consumes a string and returns its text between the quotes, escapes unresolved,
// and whether it has any. A control character, which JSON allows only escaped, ends it.
func (d *quick) raw() (text []byte, escaped, ok bool) {
	d.space()
	if d.at >= len(d.b) || d.b[d.at] != '"' {
		return nil, false, false
	}
	start := d.at + 1
	for i := start; i < len(d.b); i++ {
		switch c := d.b[i]; {
		case c == '"':
			d.at = i + 1
			return d.b[start:i], escaped, true
		case c == '\\':
			// The escaped character is checked by unescape; skipping it keeps an
			// escaped quote from ending the string.
			escaped = true
			i++
		case c < 0x20:
			return nil, false, false
		}
	}
	return nil, false, false
}

// bytes consumes a string and returns its text, escapes resolved, in a slice of its own.
func (d *quick) bytes() ([]byte, bool) {
	raw, escaped, ok := d.raw()
	if !ok {
		return nil, false
	}
	if !escaped {
		return append([]byte(nil), raw...), true
	}
	return unescape(raw)
}

func (d *quick) str() (string, bool) {
	raw, escaped, ok := d.raw()
	if !ok {
		return "", false
	}
	if !escaped {
		return string(raw), true
	}
	b, ok := unescape(raw)
	return string(b), ok
}

func (d *quick) strPtr() (*string, bool) {
	s, ok := d.str()
	return &s, ok
}

// unescape resolves the escapes of a string's text as JSON defines them. A \u escape
// that is half a surrogate pair is refused, as the strict walk refuses it.
func unescape(raw []byte) ([]byte, bool) {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		if i >= len(raw) {
			return nil, false
		}
		switch raw[i] {
		case '"', '\\', '/':
			out = append(out, raw[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(raw, i+1)
			if !ok {
				return nil, false
			}
			i += 4
			if utf16.IsSurrogate(r) {
				if r >= 0xDC00 || i+6 >= len(raw) || raw[i+1] != '\\' || raw[i+2] != 'u' {
					return nil, false
				}
				low, ok := hex4(raw, i+3)
				if !ok || low < 0xDC00 || low > 0xDFFF {
					return nil, false
				}
				r = utf16.DecodeRune(r, low)
				i += 6
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, false
		}
	}
	return out, true
}

// int consumes an integer: an optional minus and digits without a leading zero, which
// fits in 64 bits. A fraction or an exponent, which encoding/json refuses for an
// integer field, is left to the strict path to refuse.
func (d *quick) int() (int64, bool) {
	d.space()
	i := d.at
	neg := i < len(d.b) && d.b[i] == '-'
	if neg {
		i++
	}
	start := i
	var n uint64
	for ; i < len(d.b) && '0' <= d.b[i] && d.b[i] <= '9'; i++ {
		if i-start == 19 {
			return 0, false // 20 digits or more: over any int64, or a zero-padded number
		}
		n = n*10 + uint64(d.b[i]-'0')
	}
	switch {
	case i == start, d.b[start] == '0' && i > start+1:
		return 0, false
	case i < len(d.b):
		switch d.b[i] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
		default:
			return 0, false
		}
	}
	if neg && n > 1<<63 || !neg && n > 1<<63-1 {
		return 0, false
	}
	d.at = i
	if neg {
		return -int64(n), true
	}
	return int64(n), true
}

func (d *quick) intPtr() (*int64, bool) {
	n, ok := d.int()
	return &n, ok
}

// base64 consumes a string holding base64, decoded as encoding/json decodes a []byte.
func (d *quick) base64() (*[]byte, bool) {
	text, ok := d.bytes()
	if !ok {
		return nil, false
	}
	b := make([]byte, base64.StdEncoding.DecodedLen(len(text)))
	n, err := base64.StdEncoding.Decode(b, text)
	if err != nil {
		return nil, false
	}
	b = b[:n]
	return &b, true
}

func (d *quick) claim(r *api.ClaimRequest) bool {
	members, ok := d.open()
	var seen uint32
	for ok && members {
		name, named := d.name()
		if !named {
			return false
		}
		switch string(name) {
		case "key":
			ok = once(&seen, 1<<0)
			if ok {
				r.Key, ok = d.str()
			}
		case "fingerprint":
			ok = once(&seen, 1<<1)
			if ok {
				r.Fingerprint, ok = d.strPtr()
			}
		case "owner":
			ok = once(&seen, 1<<2)
			if ok {
				r.Owner, ok = d.strPtr()
			}
		case "claim_secret":
			ok = once(&seen, 1<<3)
			if ok {
				r.ClaimSecret, ok = d.strPtr()
			}
		case "lease_ms":
			ok = once(&seen, 1<<4)
			if ok {
				r.LeaseMs, ok = d.intPtr()
			}
		case "wait_ms":
			ok = once(&seen, 1<<5)
			if ok {
				r.WaitMs, ok = d.intPtr()
			}
		default:
			return false
		}
		if ok {
			members, ok = d.more()
		}
	}
	return ok
}

func (d *quick) complete(r *api.CompleteRequest) bool {
	members, ok := d.open()
	var seen uint32
	for ok && members {
		name, named := d.name()
		if !named {
			return false
		}
		switch string(name) {
		case "key":
			ok = once(&seen, 1<<0)
			if ok {
				r.Key, ok = d.str()
			}
		case "lease_token":
			ok = once(&seen, 1<<1)
			if ok {
				r.LeaseToken, ok = d.str()
			}
		case "response":
			ok = once(&seen, 1<<2) && d.response(&r.Response)
		case "retention_ms":
			ok = once(&seen, 1<<3)
			if ok {
				r.RetentionMs, ok = d.intPtr()
			}
		default:
			return false
		}
		if ok {
			members, ok = d.more()
		}
	}
	return ok
}

func (d *quick) release(r *api.ReleaseRequest) bool {
	members, ok := d.open()
	var seen uint32
	for ok && members {
		name, named := d.name()
		if !named {
			return false
		}
		switch string(name) {
		case "key":
			ok = once(&seen, 1<<0)
			if ok {
				r.Key, ok = d.str()
			}
		case "lease_token":
			ok = once(&seen, 1<<1)
			if ok {
				r.LeaseToken, ok = d.str()
			}
		case "mode":
			ok = once(&seen, 1<<2)
			if ok {
				var mode string
				mode, ok = d.str()
				r.Mode = api.ReleaseRequestMode(mode)
			}
		case "response":
			ok = once(&seen, 1<<3)
			if ok {
				r.Response = new(api.StoredResponse)
				ok = d.response(r.Response)
			}
		case "retention_ms":
			ok = once(&seen, 1<<4)
			if ok {
				r.RetentionMs, ok = d.intPtr()
			}
		default:
			return false
		}
		if ok {
			members, ok = d.more()
		}
	}
	return ok
}

func (d *quick) extend(r *api.ExtendRequest) bool {
	members, ok := d.open()
	var seen uint32
	for ok && members {
		name, named := d.name()
		if !named {
			return false
		}
		switch string(name) {
		case "key":
			ok = once(&seen, 1<<0)
			if ok {
				r.Key, ok = d.str()
			}
		case "lease_token":
			ok = once(&seen, 1<<1)
			if ok {
				r.LeaseToken, ok = d.str()
			}
		case "lease_ms":
			ok = once(&seen, 1<<2)
			if ok {
				r.LeaseMs, ok = d.int()
			}
		default:
			return false
		}
		if ok {
			members, ok = d.more()
		}
	}
	return ok
}

func (d *quick) response(r *api.StoredResponse) bool {
	members, ok := d.open()
	var seen uint32
	for ok && members {
		name, named := d.name()
		if !named {
			return false
		}
		switch string(name) {
		case "status":
			ok = once(&seen, 1<<0)
			if ok {
				var n int64
				n, ok = d.int()
				r.Status = int(n)
				ok = ok && int64(r.Status) == n
			}
		case "headers":
			ok = once(&seen, 1<<1)
			if ok {
				r.Headers, ok = d.headers()
			}
		case "body":
			ok = once(&seen, 1<<2)
			if ok {
				r.Body, ok = d.base64()
			}
		case "sealed":
			ok = once(&seen, 1<<3)
			if ok {
				r.Sealed, ok = d.base64()
			}
		default:
			return false
		}
		if ok {
			members, ok = d.more()
		}
	}
	return ok
}

// headers consumes a header map: names to arrays of strings, each name once.
func (d *quick) headers() (*map[string][]string, bool) {
	members, ok := d.open()
	h := make(map[string][]string)
	for ok && members {
		name, named := d.name()
		if !named {
			return nil, false
		}
		if _, twice := h[string(name)]; twice || !d.byte('[') {
			return nil, false
		}
		values := []string{}
		if !d.byte(']') {
			for more := true; more; {
				var v string
				if v, ok = d.str(); !ok {
					return nil, false
				}
				values = append(values, v)
				if !d.byte(',') {
					more = false
					ok = d.byte(']')
				}
			}
		}
		h[string(name)] = values
		if ok {
			members, ok = d.more()
		}
	}
	if !ok {
		return nil, false
	}
	return &h, true
}

func (d *quick) batch(r *api.BatchRequest) bool {
	members, ok := d.open()
	var seen uint32
	for ok && members {
		name, named := d.name()
		if !named || string(name) != "items" || !once(&seen, 1<<0) || !d.byte('[') {
			return false
		}
		// encoding/json makes an empty array an empty slice, not nil.
		r.Items = []api.BatchItem{}
		if !d.byte(']') {
			for more := true; more; {
				var item api.BatchItem
				if !d.batchItem(&item) {
					return false
				}
				r.Items = append(r.Items, item)
				if !d.byte(',') {
					more = false
					if !d.byte(']') {
						return false
					}
				}
			}
		}
		members, ok = d.more()
	}
	return ok
}

func (d *quick) batchItem(r *api.BatchItem) bool {
	members, ok := d.open()
	var seen uint32
	for ok && members {
		name, named := d.name()
		if !named {
			return false
		}
		switch string(name) {
		case "claim":
			r.Claim = new(api.ClaimRequest)
			ok = once(&seen, 1<<0) && d.claim(r.Claim)
		case "complete":
			r.Complete = new(api.CompleteRequest)
			ok = once(&seen, 1<<1) && d.complete(r.Complete)
		case "extend":
			r.Extend = new(api.ExtendRequest)
			ok = once(&seen, 1<<2) && d.extend(r.Extend)
		case "release":
			r.Release = new(api.ReleaseRequest)
			ok = once(&seen, 1<<3) && d.release(r.Release)
		default:
			return false
		}
		if ok {
			members, ok = d.more()
		}
	}
	return ok
}
