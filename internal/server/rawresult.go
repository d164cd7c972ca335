package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemd/idemd/internal/api"
	"github.com/idemd/idemd/internal/engine"
)

// This file is the raw form of a result: PUT /v1/keys/{key}/result completes a key with
// the stored body as the request body, and GET /v1/keys/{key}/result answers it as the
// answer body, so that a large result is neither base64 nor JSON on the wire.

// rawLimit is the largest raw body taken: the stored response's limit, which a blob
// store raises.
func (s *Server) rawLimit() int64 {
	return int64(max(s.limits.MaxResponseBytes, s.limits.MaxBlobBytes))
}

// rawMedia refuses a raw body of another media type than application/octet-stream.
func rawMedia(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if media, _, err := mime.ParseMediaType(ct); err != nil || media != "application/octet-stream" {
		return &problem{status: http.StatusUnsupportedMediaType, code: codeUnsupportedMediaType,
			detail: fmt.Sprintf("Content-Type %q: send application/octet-stream", ct)}
	}
	return nil
}

// readRaw reads an application/octet-stream request body, up to limit bytes.
func readRaw(r *http.Request, w http.ResponseWriter, limit int64) ([]byte, error) {
	if err := rawMedia(r); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if n := r.ContentLength; n > 0 && n <= limit {
		buf.Grow(int(n) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit)); err != nil {
		return nil, bodyError(err, limit)
	}
	_ = setReadDeadline(w, time.Time{})
	return buf.Bytes(), nil
}

// bodyError is the problem a failure to read a request body of at most limit bytes is.
func bodyError(err error, limit int64) error {
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return &problem{status: http.StatusRequestEntityTooLarge, code: codePayloadTooLarge,
			detail: fmt.Sprintf("request body is over %d bytes", limit)}
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &problem{status: http.StatusRequestTimeout, code: codeRequestTimeout,
			detail: "the request body did not arrive in time"}
	}
	return invalid("reading the request body: %v", err)
}

// rawBody is a raw request body as the engine reads it, streamed: a failure to read
// it is the problem bodyError makes of it, and its end lifts the read deadline, as
// readRaw's does.
type rawBody struct {
	r     io.Reader
	w     http.ResponseWriter
	limit int64
}

func (b *rawBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	switch {
	case err == io.EOF:
		_ = setReadDeadline(b.w, time.Time{})
	case err != nil:
		err = bodyError(err, b.limit)
	}
	return n, err
}

// spoolRaw reads a raw body sent without a Content-Length, up to limit bytes, and
// answers it with its size: up to keep bytes in memory, the rest in a temporary file
// (under $TMPDIR, unlinked at once), so that the body streams on from there as one
// sent with its length would. done closes the file.
func spoolRaw(r *http.Request, w http.ResponseWriter, limit, keep int64) (body io.Reader, size int64, done func(), err error) {
	src := &rawBody{r: http.MaxBytesReader(w, r.Body, limit), w: w, limit: limit}
	var head bytes.Buffer
	if _, err := head.ReadFrom(io.LimitReader(src, keep+1)); err != nil {
		return nil, 0, nil, err
	}
	if int64(head.Len()) <= keep {
		return &head, int64(head.Len()), func() {}, nil
	}
	f, err := os.CreateTemp("", "idemd-body-*")
	if err != nil {
		return nil, 0, nil, err
	}
	_ = os.Remove(f.Name())
	done = func() { _ = f.Close() }
	rest, err := io.Copy(f, src)
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		done()
		return nil, 0, nil, err
	}
	return io.MultiReader(&head, f), int64(head.Len()) + rest, done, nil
}

// streamRaw answers the body of a raw PUT as a stream with its size, when it is to be
// streamed: with a blob store, where a large result goes there as it arrives. A body
// sent with its Content-Length streams from the connection and takes no place among
// the large bodies (admitBody), since none is held whole; one sent without is spooled
// first (spoolRaw), in its place. ok is false where the body is to be read whole, as
// without a blob store, whose largest result is held in the record anyway.
func (s *Server) streamRaw(c echo.Context) (body io.Reader, size int64, done func(), ok bool, err error) {
	r, w, limit := c.Request(), c.Response(), s.rawLimit()
	if s.limits.MaxBlobBytes <= 0 || r.ContentLength == 0 {
		return nil, 0, nil, false, nil
	}
	if err := rawMedia(r); err != nil {
		return nil, 0, nil, false, err
	}
	if r.ContentLength > 0 {
		if r.ContentLength > limit {
			return nil, 0, nil, false, bodyError(&http.MaxBytesError{Limit: limit}, limit)
		}
		return &rawBody{r: r.Body, w: w, limit: limit}, r.ContentLength, func() {}, true, nil
	}
	release, err := s.admitBody(c)
	if err != nil {
		return nil, 0, nil, false, err
	}
	body, size, spooled, err := spoolRaw(r, w, limit, int64(s.limits.MaxResponseBytes))
	if err != nil {
		release()
		return nil, 0, nil, false, err
	}
	return body, size, func() { spooled(); release() }, true, nil
}

// PutResult implements PUT /v1/keys/{key}/result: POST /v1/complete with the body raw.
// With a blob store the body streams (streamRaw): a large one goes to the blob store as
// it arrives, once the engine has seen the key held.
func (s *Server) PutResult(c echo.Context, key string, params api.PutResultParams) error {
	if err := validKey("key (path)", key); err != nil {
		return err
	}
	stream, size, done, streamed, err := s.streamRaw(c)
	if err != nil {
		return err
	}
	var body []byte
	if streamed {
		defer done()
	} else {
		release, err := s.admitBody(c)
		if err != nil {
			return err
		}
		defer release()
		if body, err = readRaw(c.Request(), c.Response(), s.rawLimit()); err != nil {
			return err
		}
	}
	resp := api.StoredResponse{Status: params.IdemdStatus}
	switch {
	case params.IdemdSealed != nil && params.IdemdResultHeaders != nil:
		return invalid("Idemd-Result-Headers: a sealed result carries its headers inside the envelope")
	case params.IdemdSealed != nil && streamed:
		// The envelope's head is all idemd reads of it; it is checked before the rest
		// arrives.
		br := bufio.NewReaderSize(stream, sealFixedSize+sealMaxKeyID)
		head, err := br.Peek(int(min(size, sealFixedSize+sealMaxKeyID)))
		if err != nil {
			return err
		}
		head = bytes.Clone(head)
		resp.Sealed, stream = &head, br
	case params.IdemdSealed != nil:
		resp.Sealed = &body
	default:
		if !streamed {
			resp.Body = &body
		}
		if h := params.IdemdResultHeaders; h != nil {
			var headers map[string][]string
			d := json.NewDecoder(bytes.NewReader([]byte(*h)))
			if err := d.Decode(&headers); err != nil || d.More() || headers == nil {
				return invalid("Idemd-Result-Headers: not a JSON object of header names to lists of values")
			}
			for name, values := range headers {
				if values == nil {
					return invalid("Idemd-Result-Headers[%q]: null; send a list of values", name)
				}
			}
			resp.Headers = &headers
		}
	}
	req, err := s.completion(tenant(c), api.CompleteRequest{Key: key, LeaseToken: params.IdemdLeaseToken,
		Response: resp, RetentionMs: params.IdemdRetentionMs})
	if err != nil {
		return err
	}
	if streamed {
		headers := int64(req.Response.Size() - len(req.Response.Body))
		if err := s.limits.checkSizes("response", headers+size, size, "body and headers"); err != nil {
			return err
		}
		if st := req.Response.Status; st == http.StatusNoContent || st == http.StatusNotModified {
			return invalid("response.body: a %d response has no body; send none", st)
		}
		req.Response.Body = nil
		req.Body, req.BodySize = stream, size
	}
	if want := params.IdemdAttempt; want != nil {
		rec, err := s.engine.Lookup(c.Request().Context(), req.ID)
		if err != nil {
			return err
		}
		if rec.Attempt != *want {
			return engine.ErrLeaseLost
		}
	}
	a, err := s.complete(c, req)
	if err != nil {
		return err
	}
	return s.reply(c, a)
}

// firstChunk is how much of a result kept in the blob store GetResult reads before it
// answers: a blob that is missing, or fails its check within it, is still answered
// 502 result_unavailable, with nothing sent.
const firstChunk = 32 << 10

// GetResult implements GET /v1/keys/{key}/result: the stored body, raw. A result kept
// in the blob store streams from there, checked as it goes (engine.ResultBody): one
// that is missing, or of another size up front, is answered 502 before a byte is
// sent; one found not intact once bytes were sent has its connection cut short of the
// Content-Length it was announced with, so that no client takes it for the result.
func (s *Server) GetResult(c echo.Context, key string) error {
	if err := validKey("key (path)", key); err != nil {
		return err
	}
	return s.sendResult(c, engine.ID{Tenant: tenant(c), Key: key})
}

// sendResult answers the stored result of id raw, as GET /v1/keys/{key}/result does;
// the console's download answers it too.
func (s *Server) sendResult(c echo.Context, id engine.ID) error {
	rec, blob, err := s.engine.LookupResult(c.Request().Context(), id)
	if err != nil {
		return err
	}
	if blob != nil {
		defer blob.Close()
	}
	if rec.Response == nil || (rec.State != engine.StateCompleted && rec.State != engine.StateFailed) {
		return &problem{status: http.StatusNotFound, code: codeNotFound, detail: "key: the key has no stored result"}
	}
	h := c.Response().Header()
	h.Set("Idemd-Status", strconv.Itoa(rec.Response.Status))
	h.Set("Idemd-Outcome", string(rec.State))
	body := rec.Response.Body
	if sealedMark(rec.Response) {
		h.Set("Idemd-Sealed", "1")
	} else if len(rec.Response.Headers) > 0 {
		// Header values hold no control characters (they were checked when stored), and
		// encoding/json escapes every other byte a header value may not hold.
		b, err := json.Marshal(rec.Response.Headers)
		if err != nil {
			return err
		}
		h.Set("Idemd-Result-Headers", string(b))
	}
	size := int64(len(body))
	var buf []byte
	if blob != nil {
		size = blob.Size()
		buf = make([]byte, firstChunk)
		n, err := io.ReadFull(blob, buf)
		if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
			return err
		}
		body = buf[:n]
	}
	h.Set(echo.HeaderContentType, "application/octet-stream")
	h.Set(echo.HeaderContentLength, strconv.FormatInt(size, 10))
	setOutcome(c, "ok")
	c.Response().WriteHeader(http.StatusOK)
	if _, err := c.Response().Write(body); err != nil || blob == nil {
		return err
	}
	_, err = io.CopyBuffer(onlyWriter{c.Response()}, blob, buf)
	if blob.Err() != nil {
		s.log.Error("a result kept in the blob store failed once its answer had begun; the connection is cut",
			"err", blob.Err(), "tenant", id.Tenant)
		setOutcome(c, string(codeResultUnavailable))
		panic(http.ErrAbortHandler)
	}
	return err
}

// onlyWriter hides every method of its writer but Write, so that io.CopyBuffer reads
// through the buffer it is given.
type onlyWriter struct{ w io.Writer }

func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }

// sealedMark says whether r is a sealed response, its envelope held or not.
func sealedMark(r *engine.Response) bool {
	v := r.Headers[engine.SealedHeader]
	return len(r.Headers) == 1 && len(v) == 1 && v[0] == "1"
}
