package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"

	"github.com/idemd/idemd/internal/api"
)

// Listener wraps a plain-HTTP listener so that the requests net/http refuses before
// any handler sees them (a malformed request line, such as a path with an invalid
// percent-escape like /v1/records/%zz, or malformed headers) are answered with
// problem+json like every other error, instead of net/http's plain text. It does not
// apply under TLS, where net/http writes through the TLS connection.
func Listener(ln net.Listener) net.Listener { return problemListener{ln} }

type problemListener struct{ net.Listener }

func (l problemListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &problemConn{Conn: c}, nil
}

// problemConn rewrites net/http's canned refusals. net/http writes each as one Write
// straight to the connection, in this form, and closes the connection after it;
// answers from handlers never carry this exact header block.
type problemConn struct{ net.Conn }

const cannedHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func (c *problemConn) Write(p []byte) (int, error) {
	status, reason, ok := cannedRefusal(p)
	if !ok {
		return c.Conn.Write(p)
	}
	detail := "the request could not be parsed: " + reason
	if reason == "" {
		detail = "the request could not be parsed: a malformed request line or header, such as an invalid percent-escape in the path (%zz)"
	}
	body, err := json.Marshal(api.Problem{
		Type:   "urn:idemd:problem:" + string(codeInvalidRequest),
		Title:  http.StatusText(status),
		Status: status,
		Code:   string(codeInvalidRequest),
		Detail: &detail,
	})
	if err != nil {
		return c.Conn.Write(p)
	}
	head := fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: application/problem+json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		status, http.StatusText(status), len(body))
	if _, err := c.Conn.Write(append([]byte(head), body...)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// cannedRefusal recognises "HTTP/1.1 NNN Text" + cannedHeaders + "NNN Text[: reason]"
// and returns the status and the reason after the status text, if any.
func cannedRefusal(p []byte) (int, string, bool) {
	line, body, ok := bytes.Cut(p, []byte(cannedHeaders))
	if !ok || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) || len(line) < len("HTTP/1.1 NNN") {
		return 0, "", false
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil || status < 400 || status > 599 {
		return 0, "", false
	}
	_, reason, _ := bytes.Cut(body, []byte(": "))
	return status, string(reason), true
}
