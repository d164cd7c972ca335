package server

import (
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/idemd/idemd/internal/api"
)

// appendAnswer appends the JSON of the answers every caller receives (a claim that
// acquired, the record after a complete or a release, an extended lease, and a batch
// of them) and a newline, byte for byte what json.Encoder writes for them, without
// reflection. It returns false for any other value, and for one it would spell
// differently from encoding/json (a recovery point, a stored response, a time
// encoding/json refuses), which the caller then encodes with encoding/json.
// TestAppendAnswer and FuzzAppendAnswer hold the two to the same bytes.
func appendAnswer(b []byte, v any) ([]byte, bool) {
	ok := true
	switch v := v.(type) {
	case api.ClaimAcquired:
		b = appendAcquired(b, &v, &ok)
	case api.KeyRecord:
		b = appendRecord(b, &v, &ok)
	case api.LeaseExtended:
		b = appendExtended(b, &v, &ok)
	case api.BatchResults:
		b = appendResults(b, &v, &ok)
	default:
		return b, false
	}
	return append(b, '\n'), ok
}

func appendAcquired(b []byte, v *api.ClaimAcquired, ok *bool) []byte {
	if v.RecoveryPoint != nil {
		*ok = false
		return b
	}
	b = append(b, `{"attempt":`...)
	b = strconv.AppendInt(b, v.Attempt, 10)
	b = append(b, `,"expires_at":`...)
	b = appendTime(b, v.ExpiresAt, ok)
	b = append(b, `,"lease_expires_at":`...)
	b = appendTime(b, v.LeaseExpiresAt, ok)
	b = append(b, `,"lease_token":`...)
	b = appendString(b, v.LeaseToken)
	b = append(b, `,"outcome":`...)
	b = appendString(b, string(v.Outcome))
	b = append(b, `,"recovered":`...)
	b = strconv.AppendBool(b, v.Recovered)
	return append(b, '}')
}

func appendRecord(b []byte, v *api.KeyRecord, ok *bool) []byte {
	if v.RecoveryPoint != nil || v.Response != nil {
		*ok = false
		return b
	}
	b = append(b, `{"attempt":`...)
	b = strconv.AppendInt(b, v.Attempt, 10)
	b = append(b, `,"created_at":`...)
	b = appendTime(b, v.CreatedAt, ok)
	b = append(b, `,"expires_at":`...)
	b = appendTime(b, v.ExpiresAt, ok)
	if v.Fingerprint != nil {
		b = append(b, `,"fingerprint":`...)
		b = appendString(b, *v.Fingerprint)
	}
	b = append(b, `,"key":`...)
	b = appendString(b, v.Key)
	if v.LeaseExpiresAt != nil {
		b = append(b, `,"lease_expires_at":`...)
		b = appendTime(b, *v.LeaseExpiresAt, ok)
	}
	if v.Owner != nil {
		b = append(b, `,"owner":`...)
		b = appendString(b, *v.Owner)
	}
	b = append(b, `,"state":`...)
	b = appendString(b, v.State)
	b = append(b, `,"updated_at":`...)
	b = appendTime(b, v.UpdatedAt, ok)
	return append(b, '}')
}

func appendExtended(b []byte, v *api.LeaseExtended, ok *bool) []byte {
	b = append(b, `{"expires_at":`...)
	b = appendTime(b, v.ExpiresAt, ok)
	b = append(b, `,"lease_expires_at":`...)
	b = appendTime(b, v.LeaseExpiresAt, ok)
	return append(b, '}')
}

// appendResults appends a batch's results; one that replays a stored result or
// carries a problem leaves the whole answer to encoding/json.
func appendResults(b []byte, v *api.BatchResults, ok *bool) []byte {
	if v.Results == nil {
		*ok = false
		return b
	}
	b = append(b, `{"results":[`...)
	for i := range v.Results {
		r := &v.Results[i]
		if r.Finished != nil || r.Problem != nil {
			*ok = false
			return b
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		if r.Acquired != nil {
			b = append(b, `"acquired":`...)
			b = appendAcquired(b, r.Acquired, ok)
			b = append(b, ',')
		}
		if r.Extended != nil {
			b = append(b, `"extended":`...)
			b = appendExtended(b, r.Extended, ok)
			b = append(b, ',')
		}
		if r.Record != nil {
			b = append(b, `"record":`...)
			b = appendRecord(b, r.Record, ok)
			b = append(b, ',')
		}
		b = append(b, `"status":`...)
		b = strconv.AppendInt(b, int64(r.Status), 10)
		b = append(b, '}')
	}
	return append(b, `]}`...)
}

// appendTime appends a time as time.Time.MarshalJSON spells it, or clears ok where
// MarshalJSON would fail (a year outside 0 to 9999, for one).
func appendTime(b []byte, t time.Time, ok *bool) []byte {
	b = append(b, '"')
	b, err := t.AppendText(b)
	if err != nil {
		*ok = false
	}
	return append(b, '"')
}

// appendString appends a string as encoding/json quotes it. A string of printable
// ASCII that encoding/json leaves as it is, as keys, tokens and outcomes almost always
// are, is copied; any other is quoted by encoding/json itself, whose escapes (of
// '<', '>', '&', U+2028, invalid UTF-8 and the rest) are then the same by construction.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&':
			q, err := json.Marshal(s)
			if err != nil {
				// A string always encodes; this is not reached.
				panic(err)
			}
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// answerBuffers hold answers while they are written.
var answerBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}
