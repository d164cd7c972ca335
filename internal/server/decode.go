package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"

	"github.com/idemd/idemd/internal/api"
	"github.com/idemd/idemd/internal/engine"
)

// Limits is what the HTTP layer enforces before a request reaches the engine.
type Limits struct {
	// MaxResponseBytes bounds a stored response: its body plus its header names and
	// values.
	MaxResponseBytes int
	// MaxBlobBytes, when set (a daemon with a blob store), bounds a response whose body
	// goes to the blob store instead: over MaxResponseBytes, up to MaxBlobBytes, as
	// long as its headers alone stay within MaxResponseBytes.
	MaxBlobBytes int
	// MaxPointBytes bounds a recovery point's data; zero means
	// engine.DefaultMaxPointBytes.
	MaxPointBytes int
}

// decodeJSON reads a JSON request body into v strictly: the media type must be JSON, the
// body valid UTF-8, one JSON value with no unknown fields and nothing after it.
func decodeJSON(r *http.Request, w http.ResponseWriter, limit int64, v any) error {
	ct := r.Header.Get("Content-Type")
	if !jsonMedia(ct) {
		return &problem{status: http.StatusUnsupportedMediaType, code: codeUnsupportedMediaType,
			detail: fmt.Sprintf("Content-Type %q: send application/json", ct)}
	}
	buf := bodyBuffers.Get().(*bytes.Buffer)
	defer putBodyBuffer(buf)
	buf.Reset()
	// Room for the body the client announces, up to what the pool keeps: a client
	// announcing a large body does not get it allocated before it sends it.
	if n := r.ContentLength; n > 0 {
		buf.Grow(int(min(n+bytes.MinRead, maxPooledBody)))
	}
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit)); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &problem{status: http.StatusRequestEntityTooLarge, code: codePayloadTooLarge,
				detail: fmt.Sprintf("request body is over %d bytes", limit)}
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return &problem{status: http.StatusRequestTimeout, code: codeRequestTimeout,
				detail: "the request body did not arrive in time"}
		}
		return &problem{status: http.StatusBadRequest, code: codeInvalidJson, detail: "reading the request body: " + err.Error()}
	}
	// The body is in; see Server.deadlines.
	_ = setReadDeadline(w, time.Time{})
	return decodeBody(buf.Bytes(), v)
}

// jsonMedia says whether a Content-Type names JSON: application/json or a +json type,
// with any parameters. The usual spellings are taken without parsing.
func jsonMedia(ct string) bool {
	switch ct {
	case "application/json", "application/json; charset=utf-8":
		return true
	}
	media, _, err := mime.ParseMediaType(ct)
	return err == nil && (media == "application/json" || strings.HasSuffix(media, "+json"))
}

// bodyBuffers hold request bodies while they are decoded; nothing decoded from a body
// refers to its bytes (encoding/json and quickDecode copy what they keep), so a
// buffer is reused once its body is decoded.
var bodyBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBody is the largest buffer kept for reuse: a body larger than most is read
// into a buffer that is then left to the garbage collector, so that a few large bodies
// do not keep their memory in the pool.
const maxPooledBody = 64 << 10

func putBodyBuffer(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBody {
		bodyBuffers.Put(b)
	}
}

// decodeBody is decodeJSON without the HTTP; it is what the fuzz tests drive.
func decodeBody(body []byte, v any) error {
	// encoding/json would quietly turn invalid UTF-8 into U+FFFD, changing a key.
	if !utf8.Valid(body) {
		return &problem{status: http.StatusBadRequest, code: codeInvalidJson, detail: "request body is not valid UTF-8"}
	}
	if quickDecode(body, v) {
		return nil
	}
	return decodeStrict(body, v)
}

// decodeStrict decodes a valid UTF-8 body with encoding/json, held to the contract by
// checkStrict, and explains what is wrong with a body it refuses.
func decodeStrict(body []byte, v any) error {
	// The strict walk goes first, so that a member misnamed by its case or by a lone
	// surrogate is explained as such; malformed JSON it leaves to encoding/json's
	// messages below.
	var refused *problem
	if err := checkStrict(body, reflect.TypeOf(v)); errors.As(err, &refused) {
		return refused
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonProblem(err, v)
	}
	if _, err := dec.Token(); err != io.EOF {
		return &problem{status: http.StatusBadRequest, code: codeInvalidJson, detail: "request body has data after the JSON object"}
	}
	return nil
}

func jsonProblem(err error, v any) *problem {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var b64 base64.CorruptInputError
	switch {
	case errors.Is(err, io.EOF):
		return &problem{status: http.StatusBadRequest, code: codeInvalidJson, detail: "request body is empty; send a JSON object"}
	case errors.As(err, &syntax):
		return &problem{status: http.StatusBadRequest, code: codeInvalidJson, detail: fmt.Sprintf("malformed JSON at byte %d: %v", syntax.Offset, err)}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &problem{status: http.StatusBadRequest, code: codeInvalidJson, detail: "malformed JSON: the body ends too early"}
	case errors.As(err, &typ):
		if typ.Field == "" {
			return invalid("request body must be a JSON object, not %s", typ.Value)
		}
		return invalid("%s: expected %s, got %s", typ.Field, jsonType(typ.Type.Kind().String()), typ.Value)
	case errors.As(err, &b64):
		// The API's base64 members: a recovery point's data, and a stored response's
		// body everywhere else (a complete, a release, a batch's items).
		member := "response.body"
		if _, ok := v.(*api.RecoveryPointRequest); ok {
			member = "data"
		}
		return invalid("%s: not valid base64 (standard alphabet, padded): %v", member, err)
	}
	if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return invalid("unknown field %s", field)
	}
	return &problem{status: http.StatusBadRequest, code: codeInvalidJson, detail: err.Error()}
}

func jsonType(kind string) string {
	switch kind {
	case "int", "int64", "int32", "uint", "uint64":
		return "an integer"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "map", "struct":
		return "an object"
	case "slice":
		return "an array"
	}
	return kind
}

func validKey(field, key string) error {
	switch {
	case key == "":
		return invalid("%s is required: 1 to %d bytes of UTF-8", field, engine.MaxKeyBytes)
	case len(key) > engine.MaxKeyBytes:
		return invalid("%s is %d bytes, over the limit of %d", field, len(key), engine.MaxKeyBytes)
	case !utf8.ValidString(key):
		return invalid("%s is not valid UTF-8", field)
	}
	return nil
}

func validToken(token string) error {
	if token == "" {
		return invalid("lease_token is required")
	}
	if len(token) > engine.MaxLeaseTokenBytes {
		return invalid("lease_token is %d bytes; lease tokens are short", len(token))
	}
	return nil
}

func optional(field string, s *string, maxBytes int) (string, error) {
	if s == nil {
		return "", nil
	}
	if len(*s) > maxBytes {
		return "", invalid("%s is %d bytes, over the limit of %d", field, len(*s), maxBytes)
	}
	return *s, nil
}

func millis(field string, v *int64, lo, hi, def time.Duration) (time.Duration, error) {
	if v == nil {
		return def, nil
	}
	d := time.Duration(*v) * time.Millisecond
	if *v < lo.Milliseconds() || *v > hi.Milliseconds() {
		return 0, invalid("%s is %d; it must be between %d and %d", field, *v, lo.Milliseconds(), hi.Milliseconds())
	}
	return d, nil
}

func (s *Server) claimRequest(tenant string, r api.ClaimRequest) (engine.ClaimRequest, error) {
	var req engine.ClaimRequest
	var err error
	if err = validKey("key", r.Key); err != nil {
		return req, err
	}
	req.ID = engine.ID{Tenant: tenant, Key: r.Key}
	if req.Fingerprint, err = optional("fingerprint", r.Fingerprint, engine.MaxFingerprintBytes); err != nil {
		return req, err
	}
	if req.Owner, err = optional("owner", r.Owner, engine.MaxOwnerBytes); err != nil {
		return req, err
	}
	if req.Secret, err = optional("claim_secret", r.ClaimSecret, engine.MaxSecretBytes); err != nil {
		return req, err
	}
	if r.ClaimSecret != nil && len(req.Secret) < engine.MinSecretBytes {
		return req, invalid("claim_secret is %d bytes; it must be at least %d (128 random bits or more)", len(req.Secret), engine.MinSecretBytes)
	}
	if req.Lease, err = millis("lease_ms", r.LeaseMs, engine.MinLease, engine.MaxLease, engine.DefaultLease); err != nil {
		return req, err
	}
	if req.Wait, err = millis("wait_ms", r.WaitMs, 0, engine.MaxWait, 0); err != nil {
		return req, err
	}
	return req, nil
}

// unreplayable are the headers a stored response may not carry, lower-cased: the
// hop-by-hop headers of RFC 9110 section 7.6.1 and the framing headers, which belong
// to the connection the replay is sent on and are set by the server sending it.
var unreplayable = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true, "te": true, "trailer": true,
	"transfer-encoding": true, "upgrade": true, "content-length": true,
}

func (s *Server) storedResponse(field string, r api.StoredResponse) (engine.Response, error) {
	// A 1xx is not a final answer: replaying a stored 101 would leave its client
	// waiting for a protocol switch that never comes.
	if r.Status < 200 || r.Status > 599 {
		return engine.Response{}, invalid("%s.status is %d; it must be a final HTTP status, 200 to 599", field, r.Status)
	}
	if r.Sealed != nil {
		return s.sealedResponse(field, r)
	}
	resp := engine.Response{Status: r.Status}
	if r.Headers != nil {
		// The names in order, so that of several bad ones the same is named every
		// time; a response's few fit in an array that needs no allocation.
		var few [8]string
		names := slices.AppendSeq(few[:0], maps.Keys(*r.Headers))
		slices.Sort(names)
		for _, name := range names {
			at := func() string { return fmt.Sprintf("%s.headers[%q]", field, name) }
			lower := strings.ToLower(name)
			switch {
			case name == "":
				return engine.Response{}, invalid("%s.headers has an empty header name", field)
			case !httpguts.ValidHeaderFieldName(name):
				return engine.Response{}, invalid("%s: not a valid header name (an RFC 9110 token)", at())
			case unreplayable[lower] || strings.HasPrefix(lower, "proxy-"):
				return engine.Response{}, invalid("%s: a hop-by-hop or framing header, which the server replaying the response sets itself", at())
			case strings.EqualFold(name, engine.SealedHeader):
				return engine.Response{}, invalid("%s: the name is reserved for the mark of a sealed response; send the envelope as %s.sealed", at(), field)
			case strings.EqualFold(name, engine.BlobHeader):
				return engine.Response{}, invalid("%s: the name is reserved for the reference to a result kept in the blob store", at())
			}
			for i, v := range (*r.Headers)[name] {
				if !httpguts.ValidHeaderFieldValue(v) {
					return engine.Response{}, invalid("%s[%d]: a header value may not hold CR, LF, NUL or other control characters", at(), i)
				}
			}
		}
		resp.Headers = *r.Headers
	}
	if r.Body != nil {
		resp.Body = *r.Body
	}
	if len(resp.Body) > 0 && (r.Status == http.StatusNoContent || r.Status == http.StatusNotModified) {
		return engine.Response{}, invalid("%s.body: a %d response has no body; send none", field, r.Status)
	}
	if err := s.limits.check(field, &resp, "body and headers"); err != nil {
		return engine.Response{}, err
	}
	return resp, nil
}

// The first bytes of a sealed envelope (docs/sealing.md): a marker no UTF-8 text
// holds, the version, and the length of the key id that follows. Clients seal in
// version 2; records sealed in version 1 before are still stored and answered.
const (
	sealMarker    = 0xC1
	sealVersion   = 2
	sealMaxKeyID  = 32
	sealFixedSize = 3 + 16 + 12 + 16 // head, salt, nonce, tag
)

// sealedResponse keeps a sealed response as the store marks it. idemd cannot open the
// envelope; it reads its head only, to refuse what no client would be able to open.
func (s *Server) sealedResponse(field string, r api.StoredResponse) (engine.Response, error) {
	switch {
	case r.Headers != nil:
		return engine.Response{}, invalid("%s.headers: a sealed response carries its headers inside %s.sealed", field, field)
	case r.Body != nil:
		return engine.Response{}, invalid("%s.body: a sealed response carries its body inside %s.sealed", field, field)
	}
	env := *r.Sealed
	if err := validEnvelope(env); err != nil {
		return engine.Response{}, invalid("%s.sealed: %v", field, err)
	}
	resp := engine.Response{Status: r.Status, Headers: map[string][]string{engine.SealedHeader: {"1"}}, Body: env}
	if err := s.limits.check(field, &resp, "the envelope and its mark"); err != nil {
		return engine.Response{}, err
	}
	return resp, nil
}

// check holds a stored response to the limits: what stays in the record within
// MaxResponseBytes, the whole within MaxBlobBytes when the body may go to the blob
// store. what says what the size counts.
func (l Limits) check(field string, resp *engine.Response, what string) error {
	return l.checkSizes(field, int64(resp.Size()), int64(len(resp.Body)), what)
}

// checkSizes is check for a response of n bytes in all, body bytes of which are its
// body.
func (l Limits) checkSizes(field string, n, body int64, what string) error {
	switch {
	case n <= int64(l.MaxResponseBytes):
		return nil
	case l.MaxBlobBytes > 0 && n <= int64(l.MaxBlobBytes) && n-body <= int64(l.MaxResponseBytes):
		return nil
	case l.MaxBlobBytes > 0 && n <= int64(l.MaxBlobBytes):
		return &problem{status: http.StatusRequestEntityTooLarge, code: codePayloadTooLarge,
			detail: fmt.Sprintf("%s's headers are %d bytes, over the limit of %d", field, n-body, l.MaxResponseBytes)}
	}
	return &problem{status: http.StatusRequestEntityTooLarge, code: codePayloadTooLarge,
		detail: fmt.Sprintf("%s is %d bytes (%s), over the limit of %d", field, n, what, max(l.MaxResponseBytes, l.MaxBlobBytes))}
}

func validEnvelope(env []byte) error {
	switch {
	case len(env) == 0:
		return fmt.Errorf("empty; an envelope starts with the byte 0x%02X", sealMarker)
	case env[0] != sealMarker:
		return fmt.Errorf("not a sealed envelope: its first byte is 0x%02X, where an envelope's is 0x%02X", env[0], sealMarker)
	case len(env) < 3:
		return fmt.Errorf("%d bytes, shorter than an envelope's head", len(env))
	case env[1] < 1 || env[1] > sealVersion:
		return fmt.Errorf("envelope version %d; this daemon knows versions 1 and %d", env[1], sealVersion)
	}
	n := int(env[2])
	if n < 1 || n > sealMaxKeyID {
		return fmt.Errorf("a key id of %d bytes; it is 1 to %d", n, sealMaxKeyID)
	}
	if len(env) < sealFixedSize+n {
		return fmt.Errorf("%d bytes, shorter than the %d of the shortest envelope with a key id of %d bytes", len(env), sealFixedSize+n, n)
	}
	for _, c := range env[3 : 3+n] {
		if !validKeyIDByte(c) {
			return errors.New("the key id holds a byte other than a letter, a digit, '.', '_' or '-'")
		}
	}
	return nil
}

func validKeyIDByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}

func (s *Server) completion(tenant string, r api.CompleteRequest) (engine.Completion, error) {
	var c engine.Completion
	var err error
	if err = validKey("key", r.Key); err != nil {
		return c, err
	}
	if err = validToken(r.LeaseToken); err != nil {
		return c, err
	}
	if c.Response, err = s.storedResponse("response", r.Response); err != nil {
		return c, err
	}
	if c.Retention, err = millis("retention_ms", r.RetentionMs, engine.MinRetention, engine.MaxRetention, 0); err != nil {
		return c, err
	}
	c.ID, c.LeaseToken = engine.ID{Tenant: tenant, Key: r.Key}, r.LeaseToken
	return c, nil
}

func (s *Server) release(tenant string, r api.ReleaseRequest) (engine.Release, error) {
	var rel engine.Release
	var err error
	if err = validKey("key", r.Key); err != nil {
		return rel, err
	}
	if err = validToken(r.LeaseToken); err != nil {
		return rel, err
	}
	switch r.Mode {
	case api.Retry, api.Fail:
	case "":
		return rel, invalid("mode is required: retry or fail")
	default:
		return rel, invalid("mode is %q; it must be retry or fail", r.Mode)
	}
	if r.Response != nil {
		if r.Mode == api.Retry {
			return rel, invalid("response: only a release with mode fail stores a response")
		}
		resp, err := s.storedResponse("response", *r.Response)
		if err != nil {
			return rel, err
		}
		rel.Response = &resp
	}
	if rel.Retention, err = millis("retention_ms", r.RetentionMs, engine.MinRetention, engine.MaxRetention, 0); err != nil {
		return rel, err
	}
	rel.ID, rel.LeaseToken, rel.Mode = engine.ID{Tenant: tenant, Key: r.Key}, r.LeaseToken, engine.ReleaseMode(r.Mode)
	return rel, nil
}

func (s *Server) mark(tenant string, r api.RecoveryPointRequest) (engine.Mark, error) {
	var m engine.Mark
	var err error
	if err = validKey("key", r.Key); err != nil {
		return m, err
	}
	if err = validToken(r.LeaseToken); err != nil {
		return m, err
	}
	switch {
	case r.Name == "":
		return m, invalid("name is required: 1 to %d bytes of UTF-8", engine.MaxPointNameBytes)
	case len(r.Name) > engine.MaxPointNameBytes:
		return m, invalid("name is %d bytes, over the limit of %d", len(r.Name), engine.MaxPointNameBytes)
	case !utf8.ValidString(r.Name):
		return m, invalid("name is not valid UTF-8")
	}
	if r.Data != nil {
		if n := len(*r.Data); n > s.limits.MaxPointBytes {
			return m, &problem{status: http.StatusRequestEntityTooLarge, code: codePayloadTooLarge,
				detail: fmt.Sprintf("data is %d bytes, over the limit of %d for a recovery point", n, s.limits.MaxPointBytes)}
		}
		if len(*r.Data) > 0 {
			m.Data = *r.Data
		}
	}
	m.ID, m.LeaseToken, m.Name = engine.ID{Tenant: tenant, Key: r.Key}, r.LeaseToken, r.Name
	return m, nil
}

// abandonedQuery is the feed's query of a tenant at now.
func abandonedQuery(tenant string, p api.ListAbandonedParams, now time.Time) (engine.AbandonedQuery, error) {
	q := engine.AbandonedQuery{Tenant: tenant, Limit: engine.DefaultAbandonedLimit}
	if p.Prefix != nil {
		if len(*p.Prefix) > engine.MaxKeyBytes {
			return q, invalid("prefix is %d bytes, over the limit of %d", len(*p.Prefix), engine.MaxKeyBytes)
		}
		if !utf8.ValidString(*p.Prefix) {
			return q, invalid("prefix is not valid UTF-8")
		}
		q.Prefix = *p.Prefix
	}
	olderThan, err := millis("older_than_ms", p.OlderThanMs, 0, engine.MaxRetention, 0)
	if err != nil {
		return q, err
	}
	q.Before = now.Add(-olderThan)
	if p.Limit != nil {
		if *p.Limit < 1 || *p.Limit > engine.MaxAbandonedLimit {
			return q, invalid("limit is %d; it must be between 1 and %d", *p.Limit, engine.MaxAbandonedLimit)
		}
		q.Limit = *p.Limit
	}
	if p.Cursor != nil {
		raw, err := base64.RawURLEncoding.DecodeString(*p.Cursor)
		if err != nil || len(raw) == 0 {
			return q, invalid("cursor is not a next_cursor of this feed")
		}
		q.Cursor = string(raw)
	}
	return q, nil
}

func (s *Server) extension(tenant string, r api.ExtendRequest) (engine.Extension, error) {
	var e engine.Extension
	var err error
	if err = validKey("key", r.Key); err != nil {
		return e, err
	}
	if err = validToken(r.LeaseToken); err != nil {
		return e, err
	}
	if r.LeaseMs == 0 {
		return e, invalid("lease_ms is required: between %d and %d", engine.MinLease.Milliseconds(), engine.MaxLease.Milliseconds())
	}
	if e.Lease, err = millis("lease_ms", &r.LeaseMs, engine.MinLease, engine.MaxLease, 0); err != nil {
		return e, err
	}
	e.ID, e.LeaseToken = engine.ID{Tenant: tenant, Key: r.Key}, r.LeaseToken
	return e, nil
}
