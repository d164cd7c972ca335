package idem

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/idemd/idemd/clients/go/idemapi"
)

// decodeBatchResults decodes a batch's answer into out as json.Unmarshal does.
//
// Reading a batch's answer with encoding/json was the largest part of what the client
// spent on a call: the answer is scanned twice (once to validate it, once to decode
// it) and decoded by reflection. fastBatchResults reads the answers idemd writes in
// one pass; anything it is not sure to read exactly as encoding/json would (an escape
// or a byte outside printable ASCII in a string, a null, a number that is not a plain
// integer, a member name repeated or matching a field only without regard to case, a
// problem) sends the whole answer to encoding/json instead, so that both ways give the
// same result or the same error. FuzzBatchResults holds it to that.
func decodeBatchResults(body []byte, out *batchResults) error {
	var fast batchResults
	if fastBatchResults(body, &fast) {
		*out = fast
		return nil
	}
	return json.Unmarshal(body, out)
}

// fastBatchResults reads body into out, or reports false when it cannot be sure to
// read it as encoding/json does.
func fastBatchResults(body []byte, out *batchResults) bool {
	r := answerReader{b: body}
	var seen uint
	ok := r.object(func(name []byte) bool {
		switch {
		case string(name) == "results" && r.first(&seen, 1):
			out.Results = make([]batchItemResult, 0, 16)
			return r.array(func() bool {
				out.Results = append(out.Results, batchItemResult{})
				return r.item(&out.Results[len(out.Results)-1])
			})
		default:
			return r.unknown(name, "results")
		}
	})
	r.space()
	return ok && r.i == len(r.b)
}

// answerReader reads JSON from b at i. Its methods report false, and stop, at anything
// they leave to encoding/json.
type answerReader struct {
	b []byte
	i int
}

func (r *answerReader) space() {
	for r.i < len(r.b) && (r.b[r.i] == ' ' || r.b[r.i] == '\t' || r.b[r.i] == '\n' || r.b[r.i] == '\r') {
		r.i++
	}
}

// next reports whether the next byte after white space is c, and consumes it if so.
func (r *answerReader) next(c byte) bool {
	r.space()
	if r.i < len(r.b) && r.b[r.i] == c {
		r.i++
		return true
	}
	return false
}

// first marks field bit of seen, and reports whether it was not marked yet:
// encoding/json merges a repeated member into what the first one decoded.
func (r *answerReader) first(seen *uint, bit uint) bool {
	if *seen&bit != 0 {
		return false
	}
	*seen |= bit
	return true
}

// object reads an object, calling member for each member name with the reader at
// its value, which member must read.
func (r *answerReader) object(member func(name []byte) bool) bool {
	if !r.next('{') {
		return false
	}
	if r.next('}') {
		return true
	}
	for {
		name, ok := r.plain()
		if !ok || !r.next(':') || !member(name) {
			return false
		}
		if r.next(',') {
			continue
		}
		return r.next('}')
	}
}

// array reads an array, calling element with the reader at each element.
func (r *answerReader) array(element func() bool) bool {
	if !r.next('[') {
		return false
	}
	if r.next(']') {
		return true
	}
	for {
		if !element() {
			return false
		}
		if r.next(',') {
			continue
		}
		return r.next(']')
	}
}

// plain reads a string of printable ASCII without escapes and returns what is
// between its quotes.
func (r *answerReader) plain() ([]byte, bool) {
	raw, ok := r.quoted()
	if !ok {
		return nil, false
	}
	return raw[1 : len(raw)-1], true
}

// quoted is plain with the quotes.
func (r *answerReader) quoted() ([]byte, bool) {
	if !r.next('"') {
		return nil, false
	}
	start := r.i - 1
	for ; r.i < len(r.b); r.i++ {
		switch c := r.b[r.i]; {
		case c == '"':
			r.i++
			return r.b[start:r.i], true
		case c == '\\' || c < 0x20 || c > 0x7e:
			return nil, false
		}
	}
	return nil, false
}

func (r *answerReader) str(v *string) bool {
	s, ok := r.plain()
	*v = string(s)
	return ok
}

// word is str for a member that is mostly one of known: those are not copied.
func (r *answerReader) word(v *string, known ...string) bool {
	s, ok := r.plain()
	for _, k := range known {
		if string(s) == k {
			*v = k
			return ok
		}
	}
	*v = string(s)
	return ok
}

// integer reads an integer without fraction or exponent, of at most 18 digits so
// that it cannot overflow.
func (r *answerReader) integer() (int64, bool) {
	r.space()
	neg := r.i < len(r.b) && r.b[r.i] == '-'
	if neg {
		r.i++
	}
	start := r.i
	var n int64
	for r.i < len(r.b) && r.b[r.i] >= '0' && r.b[r.i] <= '9' {
		n = n*10 + int64(r.b[r.i]-'0')
		r.i++
	}
	digits := r.i - start
	if digits == 0 || digits > 18 || (digits > 1 && r.b[start] == '0') {
		return 0, false
	}
	if r.i < len(r.b) && (r.b[r.i] == '.' || r.b[r.i] == 'e' || r.b[r.i] == 'E') {
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

func (r *answerReader) int64(v *int64) bool {
	n, ok := r.integer()
	*v = n
	return ok
}

func (r *answerReader) int(v *int) bool {
	n, ok := r.integer()
	*v = int(n)
	return ok
}

func (r *answerReader) bool(v *bool) bool {
	r.space()
	switch {
	case bytes.HasPrefix(r.b[r.i:], []byte("true")):
		*v = true
		r.i += 4
	case bytes.HasPrefix(r.b[r.i:], []byte("false")):
		*v = false
		r.i += 5
	default:
		return false
	}
	return true
}

// time reads a timestamp as encoding/json does: by time.Time's UnmarshalJSON.
func (r *answerReader) time(v *time.Time) bool {
	raw, ok := r.quoted()
	return ok && v.UnmarshalJSON(raw) == nil
}

// bytes reads a base64 string as encoding/json reads it into a []byte.
func (r *answerReader) base64() ([]byte, bool) {
	s, ok := r.plain()
	if !ok {
		return nil, false
	}
	b := make([]byte, base64.StdEncoding.DecodedLen(len(s)))
	n, err := base64.StdEncoding.Decode(b, s)
	return b[:n], err == nil
}

// unknown skips the value of a member that is not one of fields, unless it is one
// of them but for case, which encoding/json would decode into that field.
func (r *answerReader) unknown(name []byte, fields ...string) bool {
	for _, f := range fields {
		// encoding/json's matching of a member name to a field's, for names of
		// printable ASCII.
		if asciiEqualFold(name, f) {
			return false
		}
	}
	return r.skip(0)
}

// skip reads any JSON value, as strictly as encoding/json checks it.
func (r *answerReader) skip(depth int) bool {
	if depth > 64 {
		return false
	}
	r.space()
	if r.i == len(r.b) {
		return false
	}
	switch c := r.b[r.i]; {
	case c == '{':
		return r.object(func([]byte) bool { return r.skip(depth + 1) })
	case c == '[':
		return r.array(func() bool { return r.skip(depth + 1) })
	case c == '"':
		_, ok := r.quoted()
		return ok
	case c == 't' || c == 'f':
		var b bool
		return r.bool(&b)
	case c == '-' || (c >= '0' && c <= '9'):
		_, ok := r.integer()
		return ok
	}
	return false
}

// item reads one result of a batch. A problem is left to encoding/json: it is not on
// the path of a call that succeeds.
func (r *answerReader) item(out *batchItemResult) bool {
	var seen uint
	return r.object(func(name []byte) bool {
		switch {
		case string(name) == "status" && r.first(&seen, 1):
			return r.int(&out.Status)
		case string(name) == "acquired" && r.first(&seen, 2):
			out.Acquired = new(idemapi.ClaimAcquired)
			return r.acquired(out.Acquired)
		case string(name) == "finished" && r.first(&seen, 4):
			out.Finished = new(idemapi.ClaimFinished)
			return r.finished(out.Finished)
		case string(name) == "record" && r.first(&seen, 8):
			out.Record = new(finishedRecord)
			return r.record(out.Record)
		case string(name) == "extended" && r.first(&seen, 16):
			out.Extended = new(idemapi.LeaseExtended)
			return r.extended(out.Extended)
		default:
			return r.unknown(name, "status", "acquired", "finished", "record", "extended", "problem")
		}
	})
}

func (r *answerReader) acquired(out *idemapi.ClaimAcquired) bool {
	var seen uint
	return r.object(func(name []byte) bool {
		switch {
		case string(name) == "attempt" && r.first(&seen, 1):
			return r.int64(&out.Attempt)
		case string(name) == "expires_at" && r.first(&seen, 2):
			return r.time(&out.ExpiresAt)
		case string(name) == "lease_expires_at" && r.first(&seen, 4):
			return r.time(&out.LeaseExpiresAt)
		case string(name) == "lease_token" && r.first(&seen, 8):
			return r.str(&out.LeaseToken)
		case string(name) == "outcome" && r.first(&seen, 16):
			var s string
			ok := r.word(&s, "acquired")
			out.Outcome = idemapi.ClaimAcquiredOutcome(s)
			return ok
		case string(name) == "recovered" && r.first(&seen, 32):
			return r.bool(&out.Recovered)
		case string(name) == "recovery_point" && r.first(&seen, 64):
			out.RecoveryPoint = new(idemapi.RecoveryPoint)
			return r.recoveryPoint(out.RecoveryPoint)
		default:
			return r.unknown(name, "attempt", "expires_at", "lease_expires_at", "lease_token", "outcome", "recovered", "recovery_point")
		}
	})
}

// recoveryPoint reads the recovery point a claim that acquired hands on. The record a
// complete or release answers carries one too, which the client has no use for there:
// finishedRecord has no field for it, so it is skipped as encoding/json skips it.
func (r *answerReader) recoveryPoint(out *idemapi.RecoveryPoint) bool {
	var seen uint
	return r.object(func(name []byte) bool {
		switch {
		case string(name) == "attempt" && r.first(&seen, 1):
			return r.int64(&out.Attempt)
		case string(name) == "data" && r.first(&seen, 2):
			b, ok := r.base64()
			out.Data = &b
			return ok
		case string(name) == "name" && r.first(&seen, 4):
			return r.str(&out.Name)
		case string(name) == "recorded_at" && r.first(&seen, 8):
			return r.time(&out.RecordedAt)
		default:
			return r.unknown(name, "attempt", "data", "name", "recorded_at")
		}
	})
}

func (r *answerReader) finished(out *idemapi.ClaimFinished) bool {
	var seen uint
	return r.object(func(name []byte) bool {
		switch {
		case string(name) == "attempt" && r.first(&seen, 1):
			return r.int64(&out.Attempt)
		case string(name) == "expires_at" && r.first(&seen, 2):
			return r.time(&out.ExpiresAt)
		case string(name) == "outcome" && r.first(&seen, 4):
			var s string
			ok := r.word(&s, "completed", "failed")
			out.Outcome = idemapi.ClaimFinishedOutcome(s)
			return ok
		case string(name) == "response" && r.first(&seen, 8):
			out.Response = new(idemapi.StoredResponse)
			return r.response(out.Response)
		default:
			return r.unknown(name, "attempt", "expires_at", "outcome", "response")
		}
	})
}

func (r *answerReader) response(out *idemapi.StoredResponse) bool {
	var seen uint
	return r.object(func(name []byte) bool {
		switch {
		case string(name) == "status" && r.first(&seen, 1):
			return r.int(&out.Status)
		case string(name) == "body" && r.first(&seen, 2):
			b, ok := r.base64()
			out.Body = &b
			return ok
		case string(name) == "sealed" && r.first(&seen, 8):
			b, ok := r.base64()
			out.Sealed = &b
			return ok
		case string(name) == "headers" && r.first(&seen, 4):
			h := map[string][]string{}
			out.Headers = &h
			return r.object(func(name []byte) bool {
				if _, repeated := h[string(name)]; repeated {
					return false
				}
				values := []string{}
				ok := r.array(func() bool {
					var v string
					ok := r.str(&v)
					values = append(values, v)
					return ok
				})
				h[string(name)] = values
				return ok
			})
		default:
			return r.unknown(name, "status", "body", "headers", "sealed")
		}
	})
}

func (r *answerReader) record(out *finishedRecord) bool {
	var seen uint
	return r.object(func(name []byte) bool {
		switch {
		case string(name) == "state" && r.first(&seen, 1):
			return r.word(&out.State, "completed", "failed", "released", "pending")
		case string(name) == "attempt" && r.first(&seen, 2):
			return r.int64(&out.Attempt)
		case string(name) == "fingerprint" && r.first(&seen, 4):
			out.Fingerprint = new(string)
			return r.str(out.Fingerprint)
		case string(name) == "expires_at" && r.first(&seen, 8):
			return r.time(&out.ExpiresAt)
		default:
			return r.unknown(name, "state", "attempt", "fingerprint", "expires_at")
		}
	})
}

func (r *answerReader) extended(out *idemapi.LeaseExtended) bool {
	var seen uint
	return r.object(func(name []byte) bool {
		switch {
		case string(name) == "expires_at" && r.first(&seen, 1):
			return r.time(&out.ExpiresAt)
		case string(name) == "lease_expires_at" && r.first(&seen, 2):
			return r.time(&out.LeaseExpiresAt)
		default:
			return r.unknown(name, "expires_at", "lease_expires_at")
		}
	})
}
