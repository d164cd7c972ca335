package idem

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/idemd/idemd/clients/go/idemapi"
)

// encode returns the one member of item and its request as JSON, byte for byte what
// json.Marshal writes for it (FuzzEncode holds it to that), without its reflection:
// every call is encoded, and json.Marshal was a tenth of what a call cost the client.
func encode(item idemapi.BatchItem) (op string, body []byte, err error) {
	switch {
	case item.Claim != nil:
		return "claim", appendClaim(make([]byte, 0, 320), item.Claim), nil
	case item.Complete != nil:
		return "complete", appendComplete(make([]byte, 0, 256+responseSize(&item.Complete.Response)), item.Complete), nil
	case item.Release != nil:
		size := 256
		if item.Release.Response != nil {
			size += responseSize(item.Release.Response)
		}
		return "release", appendRelease(make([]byte, 0, size), item.Release), nil
	case item.Extend != nil:
		return "extend", appendExtend(make([]byte, 0, 192), item.Extend), nil
	}
	return "", nil, errors.New("idem: an operation without a body")
}

func appendClaim(b []byte, c *idemapi.ClaimRequest) []byte {
	b = append(b, '{')
	if c.ClaimSecret != nil {
		b = appendMember(b, "claim_secret")
		b = appendJSONString(b, *c.ClaimSecret)
	}
	if c.Fingerprint != nil {
		b = appendMember(b, "fingerprint")
		b = appendJSONString(b, *c.Fingerprint)
	}
	b = appendMember(b, "key")
	b = appendJSONString(b, c.Key)
	if c.LeaseMs != nil {
		b = appendMember(b, "lease_ms")
		b = strconv.AppendInt(b, *c.LeaseMs, 10)
	}
	if c.Owner != nil {
		b = appendMember(b, "owner")
		b = appendJSONString(b, *c.Owner)
	}
	if c.WaitMs != nil {
		b = appendMember(b, "wait_ms")
		b = strconv.AppendInt(b, *c.WaitMs, 10)
	}
	return append(b, '}')
}

func appendComplete(b []byte, c *idemapi.CompleteRequest) []byte {
	b = append(b, '{')
	b = appendMember(b, "key")
	b = appendJSONString(b, c.Key)
	b = appendMember(b, "lease_token")
	b = appendJSONString(b, c.LeaseToken)
	b = appendMember(b, "response")
	b = appendResponse(b, &c.Response)
	if c.RetentionMs != nil {
		b = appendMember(b, "retention_ms")
		b = strconv.AppendInt(b, *c.RetentionMs, 10)
	}
	return append(b, '}')
}

func appendRelease(b []byte, r *idemapi.ReleaseRequest) []byte {
	b = append(b, '{')
	b = appendMember(b, "key")
	b = appendJSONString(b, r.Key)
	b = appendMember(b, "lease_token")
	b = appendJSONString(b, r.LeaseToken)
	b = appendMember(b, "mode")
	b = appendJSONString(b, string(r.Mode))
	if r.Response != nil {
		b = appendMember(b, "response")
		b = appendResponse(b, r.Response)
	}
	if r.RetentionMs != nil {
		b = appendMember(b, "retention_ms")
		b = strconv.AppendInt(b, *r.RetentionMs, 10)
	}
	return append(b, '}')
}

func appendExtend(b []byte, e *idemapi.ExtendRequest) []byte {
	b = append(b, '{')
	b = appendMember(b, "key")
	b = appendJSONString(b, e.Key)
	b = appendMember(b, "lease_ms")
	b = strconv.AppendInt(b, e.LeaseMs, 10)
	b = appendMember(b, "lease_token")
	b = appendJSONString(b, e.LeaseToken)
	return append(b, '}')
}

func appendResponse(b []byte, r *idemapi.StoredResponse) []byte {
	b = append(b, '{')
	if r.Body != nil {
		b = appendMember(b, "body")
		b = appendBase64(b, *r.Body)
	}
	if r.Headers != nil {
		b = appendMember(b, "headers")
		b = appendHeaders(b, *r.Headers)
	}
	if r.Sealed != nil {
		b = appendMember(b, "sealed")
		b = appendBase64(b, *r.Sealed)
	}
	b = appendMember(b, "status")
	b = strconv.AppendInt(b, int64(r.Status), 10)
	return append(b, '}')
}

// appendBase64 writes bytes as json.Marshal does: a base64 string, or null for nil.
func appendBase64(b, data []byte) []byte {
	if data == nil {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, data)
	return append(b, '"')
}

// appendHeaders writes the map as json.Marshal does: names in order, a nil list of
// values as null.
func appendHeaders(b []byte, h map[string][]string) []byte {
	if h == nil {
		return append(b, "null"...)
	}
	var small [8]string
	names := small[:0]
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	b = append(b, '{')
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, name)
		b = append(b, ':')
		values := h[name]
		if values == nil {
			b = append(b, "null"...)
			continue
		}
		b = append(b, '[')
		for j, v := range values {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, v)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendMember writes the name of a member, after a comma unless it is the first.
func appendMember(b []byte, name string) []byte {
	if b[len(b)-1] != '{' {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

// appendJSONString writes s as json.Marshal does. Printable ASCII other than the
// characters it escapes goes as it is; anything else is left to json.Marshal.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			// A copy, so that the strings of a request need not be on the heap on
			// the common path for json.Marshal to have them on this one.
			quoted, _ := json.Marshal(strings.Clone(s))
			return append(b, quoted...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// responseSize is about what appendResponse writes.
func responseSize(r *idemapi.StoredResponse) int {
	n := 64
	if r.Body != nil {
		n += base64.StdEncoding.EncodedLen(len(*r.Body))
	}
	if r.Sealed != nil {
		n += base64.StdEncoding.EncodedLen(len(*r.Sealed))
	}
	if r.Headers != nil {
		for name, values := range *r.Headers {
			n += len(name) + 8
			for _, v := range values {
				n += len(v) + 3
			}
		}
	}
	return n
}
