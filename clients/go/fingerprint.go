package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strings"

	"github.com/gowebpki/jcs"
)

// The exact algorithms below are written down in docs/middleware.md and pinned by the
// vectors in clients/testdata, which the TypeScript and Python middlewares read too:
// change one and every language changes with it.

// maxJSONDepth is the deepest nesting of arrays and objects that is canonicalised;
// a deeper body is fingerprinted as it is. It keeps every language's JSON parser
// within its recursion limits, so that all of them decide the same way.
const maxJSONDepth = 128

// keyNamespace begins every idemd key the middleware uses. Keys the service's own
// code passes to Do and Once live outside it, so an HTTP caller cannot name them.
const keyNamespace = "idempotency-key:v1:"

// Fingerprint is the digest the middleware claims with, "sha256:" and 64 lowercase
// hex digits: SHA-256 over the method, the path and the query exactly as the client
// sent them, the media type, and the body, a JSON body first canonicalised by RFC
// 8785 (JCS) so that key order, spacing, escapes and the spelling of numbers do not
// matter. body is the request body as read; r.Body is not touched.
func Fingerprint(r *http.Request, body []byte) string {
	path, query := requestTarget(r)
	return fingerprint(r.Method, path, query, r.Header.Get("Content-Type"), r.Header.Get("Content-Encoding"), body)
}

func fingerprint(method, path, query, contentType, contentEncoding string, body []byte) string {
	media := mediaType(contentType)
	canonical, _ := canonicalBody(media, contentEncoding, body)
	h := sha256.New()
	for _, field := range [][]byte{[]byte(method), []byte(path), []byte(query), []byte(media), canonical} {
		writeField(h, field)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// writeField writes one length-prefixed field, so that no two lists of fields
// hash the same bytes.
func writeField(h hash.Hash, field []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(field)))
	h.Write(n[:])
	h.Write(field)
}

// requestTarget returns the path and the query of the request-target as the client
// sent them, percent-encoding untouched.
func requestTarget(r *http.Request) (path, query string) {
	target := r.RequestURI
	if target == "" || target == "*" {
		// A request built in process rather than read from the wire.
		return r.URL.EscapedPath(), r.URL.RawQuery
	}
	if !strings.HasPrefix(target, "/") {
		// Absolute form (through a proxy): drop the scheme and the authority.
		if _, rest, ok := strings.Cut(target, "://"); ok {
			if i := strings.IndexAny(rest, "/?"); i >= 0 {
				target = rest[i:]
			} else {
				target = ""
			}
		}
		if !strings.HasPrefix(target, "/") {
			target = "/" + target
		}
	}
	path, query, _ = strings.Cut(target, "?")
	return path, query
}

// mediaType is the Content-Type without its parameters, trimmed and in lower case.
// It is deliberately simpler than a full media type parser, so that every language
// gets the same string from the same header.
func mediaType(contentType string) string {
	media, _, _ := strings.Cut(contentType, ";")
	return asciiLower(strings.Trim(media, " \t"))
}

func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// asciiEqualFold reports whether asciiLower(a) == asciiLower(b), for a string or the
// bytes of one.
func asciiEqualFold[S ~string | ~[]byte](a S, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range len(a) {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

func isJSONMedia(media string) bool {
	return media == "application/json" || strings.HasSuffix(media, "+json")
}

// canonicalBody returns the bytes of the body that enter the fingerprint: the JCS
// form of a JSON body that is I-JSON (RFC 7493), else the body as it is. Anything
// the JCS library refuses (invalid UTF-8, a byte order mark, duplicate member
// names, a lone surrogate, a number beyond a double, trailing data) keeps the raw
// bytes, so two bodies that differ never share a fingerprint by being "fixed".
func canonicalBody(media, contentEncoding string, body []byte) ([]byte, bool) {
	if !isJSONMedia(media) || len(body) == 0 {
		return body, false
	}
	if ce := asciiLower(strings.Trim(contentEncoding, " \t")); ce != "" && ce != "identity" {
		return body, false
	}
	out, err := jcs.Transform(body)
	if err != nil || jsonDepth(body) > maxJSONDepth {
		return body, false
	}
	return out, true
}

// jsonDepth is the deepest nesting of arrays and objects in valid JSON.
func jsonDepth(body []byte) int {
	depth, deepest := 0, 0
	inString, escaped := false, false
	for _, c := range body {
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case inString && c == '"':
			inString = false
		case inString:
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}

// MiddlewareKey is the idemd key under which Middleware keeps the request of scope
// that carried Idempotency-Key key: "idempotency-key:v1:" and the lowercase hex
// SHA-256 of the scope and the key, each prefixed by its length as 8 bytes big-endian.
// Use it to look a request up with Lookup, after the prefix of a middleware with
// WithKeyPrefix. Keys in this namespace are reserved for the middleware: a service's
// own Do and Once keys must not begin with it, nor with a prefix followed by it.
func MiddlewareKey(scope, key string) string {
	h := sha256.New()
	writeField(h, []byte(scope))
	writeField(h, []byte(key))
	return keyNamespace + hex.EncodeToString(h.Sum(nil))
}

// maxHeaderKeyBytes bounds the key a client may send.
const maxHeaderKeyBytes = 255

// maxKeyBytes bounds an idemd key, and middlewareKeyBytes is the length of every key
// MiddlewareKey derives: the namespace and a hex SHA-256.
const (
	maxKeyBytes        = 255
	middlewareKeyBytes = len(keyNamespace) + 2*sha256.Size
)

var errNoKey = errors.New("no Idempotency-Key")

// parseKeyHeader reads the Idempotency-Key field lines of a request: one line, an RFC
// 8941 sf-string ("...") without parameters, or the same characters bare when they are
// all token characters. It returns errNoKey when there is no line at all.
func parseKeyHeader(lines []string) (string, error) {
	switch len(lines) {
	case 0:
		return "", errNoKey
	case 1:
	default:
		return "", fmt.Errorf("%d Idempotency-Key header lines; send one", len(lines))
	}
	value := strings.Trim(lines[0], " \t")
	if value == "" {
		return "", errors.New("the Idempotency-Key header is empty")
	}
	var key string
	if value[0] == '"' {
		var err error
		if key, err = parseSFString(value); err != nil {
			return "", err
		}
	} else {
		for i := 0; i < len(value); i++ {
			if !isBareKeyChar(value[i]) {
				return "", fmt.Errorf("the Idempotency-Key has %q at byte %d; quote it as a Structured Field string (\"...\") with printable ASCII only", value[i], i)
			}
		}
		key = value
	}
	switch {
	case key == "":
		return "", errors.New("the Idempotency-Key is empty")
	case len(key) > maxHeaderKeyBytes:
		return "", fmt.Errorf("the Idempotency-Key is %d bytes, over the limit of %d", len(key), maxHeaderKeyBytes)
	}
	return key, nil
}

// parseSFString parses value, which begins with a quote, as an RFC 8941 String and
// nothing after it.
func parseSFString(value string) (string, error) {
	var key strings.Builder
	for i := 1; i < len(value); i++ {
		c := value[i]
		switch {
		case c == '\\':
			i++
			if i == len(value) || (value[i] != '"' && value[i] != '\\') {
				return "", errors.New("the Idempotency-Key has a backslash that escapes neither \" nor \\")
			}
			key.WriteByte(value[i])
		case c == '"':
			if i != len(value)-1 {
				return "", errors.New("the Idempotency-Key has something after its closing quote (parameters are not accepted)")
			}
			return key.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("the Idempotency-Key has byte 0x%02x; only printable ASCII is allowed", c)
		default:
			key.WriteByte(c)
		}
	}
	return "", errors.New("the Idempotency-Key has no closing quote")
}

// isBareKeyChar reports whether c may appear in an unquoted key: the characters of
// an RFC 8941 Token (tchar, ":" and "/"), in any position.
func isBareKeyChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}
