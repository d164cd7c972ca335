package server

import (
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

// readRaw reads an application/octet-stream request body, up to limit bytes.
func readRaw(r *http.Request, w http.ResponseWriter, limit int64) ([]byte, error) {
	ct := r.Header.Get("Content-Type")
	if media, _, err := mime.ParseMediaType(ct); err != nil || media != "application/octet-stream" {
		return nil, &problem{status: http.StatusUnsupportedMediaType, code: codeUnsupportedMediaType,
			detail: fmt.Sprintf("Content-Type %q: send application/octet-stream", ct)}
	}
	var buf bytes.Buffer
	if n := r.ContentLength; n > 0 && n <= limit {
		buf.Grow(int(n) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit)); err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return nil, &problem{status: http.StatusRequestEntityTooLarge, code: codePayloadTooLarge,
				detail: fmt.Sprintf("request body is over %d bytes", limit)}
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, &problem{status: http.StatusRequestTimeout, code: codeRequestTimeout,
				detail: "the request body did not arrive in time"}
		}
		return nil, invalid("reading the request body: %v", err)
	}
	_ = setReadDeadline(w, time.Time{})
	return buf.Bytes(), nil
}

// PutResult implements PUT /v1/keys/{key}/result: POST /v1/complete with the body raw.
func (s *Server) PutResult(c echo.Context, key string, params api.PutResultParams) error {
	if err := validKey("key (path)", key); err != nil {
		return err
	}
	release, err := s.admitBody(c)
	if err != nil {
		return err
	}
	defer release()
	body, err := readRaw(c.Request(), c.Response(), s.rawLimit())
	if err != nil {
		return err
	}
	resp := api.StoredResponse{Status: params.IdemdStatus}
	switch {
	case params.IdemdSealed != nil && params.IdemdResultHeaders != nil:
		return invalid("Idemd-Result-Headers: a sealed result carries its headers inside the envelope")
	case params.IdemdSealed != nil:
		resp.Sealed = &body
	default:
		resp.Body = &body
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

// GetResult implements GET /v1/keys/{key}/result: the stored body, raw. The engine
// answers a result kept in the blob store only once it is read back whole and checked,
// so no byte is sent of one that is not intact.
func (s *Server) GetResult(c echo.Context, key string) error {
	if err := validKey("key (path)", key); err != nil {
		return err
	}
	return s.sendResult(c, engine.ID{Tenant: tenant(c), Key: key})
}

// sendResult answers the stored result of id raw, as GET /v1/keys/{key}/result does;
// the console's download answers it too.
func (s *Server) sendResult(c echo.Context, id engine.ID) error {
	rec, err := s.engine.Lookup(c.Request().Context(), id)
	if err != nil {
		return err
	}
	if rec.Response == nil || (rec.State != engine.StateCompleted && rec.State != engine.StateFailed) {
		return &problem{status: http.StatusNotFound, code: codeNotFound, detail: "key: the key has no stored result"}
	}
	h := c.Response().Header()
	h.Set("Idemd-Status", strconv.Itoa(rec.Response.Status))
	h.Set("Idemd-Outcome", string(rec.State))
	body := rec.Response.Body
	if env := rec.Response.Sealed(); env != nil {
		h.Set("Idemd-Sealed", "1")
		body = env
	} else if len(rec.Response.Headers) > 0 {
		// Header values hold no control characters (they were checked when stored), and
		// encoding/json escapes every other byte a header value may not hold.
		b, err := json.Marshal(rec.Response.Headers)
		if err != nil {
			return err
		}
		h.Set("Idemd-Result-Headers", string(b))
	}
	h.Set(echo.HeaderContentType, "application/octet-stream")
	h.Set(echo.HeaderContentLength, strconv.Itoa(len(body)))
	setOutcome(c, "ok")
	c.Response().WriteHeader(http.StatusOK)
	_, err = io.Copy(c.Response(), bytes.NewReader(body))
	return err
}
