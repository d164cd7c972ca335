package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemd/idemd/internal/api"
	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
)

// code is a problem's machine-readable reason. The contract lists these values and
// tells clients to accept others, so new ones may be added.
type code string

// The problem codes.
const (
	codeInvalidRequest       code = "invalid_request"
	codeInvalidJson          code = "invalid_json"
	codeUnsupportedMediaType code = "unsupported_media_type"
	codePayloadTooLarge      code = "payload_too_large"
	codeNotFound             code = "not_found"
	codeInProgress           code = "in_progress"
	codeFingerprintMismatch  code = "fingerprint_mismatch"
	codeLeaseLost            code = "lease_lost"
	codeStoreUnavailable     code = "store_unavailable"
	codeNotReplicated        code = "not_replicated"
	codeStoreMoved           code = "store_moved"
	codeMethodNotAllowed     code = "method_not_allowed"
	codeInternal             code = "internal"
	codeUnauthenticated      code = "unauthenticated"
	codeForbidden            code = "forbidden"
	codeRateLimited          code = "rate_limited"
	codeRequestTimeout       code = "request_timeout"
	codeNotSupported         code = "not_supported"
	codeQuotaExceeded        code = "quota_exceeded"
	codeResultUnavailable    code = "result_unavailable"
	// codeClientClosed is never sent: it is the outcome of a request whose caller hung
	// up before the answer, counted apart from the store's failures.
	codeClientClosed code = "client_closed_request"
)

// statusClientClosed is the status nginx logs for a client that closed its request
// first; no client ever receives it.
const statusClientClosed = 499

// problem is an RFC 9457 problem detail on its way to the client. Handlers return it
// (or a domain error) and the error handler renders it; handlers never write errors
// themselves.
type problem struct {
	status     int
	code       code
	detail     string
	retryAfter time.Duration
	cause      error
	// quota is the usage and the limit of a quota_exceeded.
	quota *engine.QuotaError
	// challenge is the WWW-Authenticate header of a 401.
	challenge string
}

func (p *problem) Error() string { return string(p.code) + ": " + p.detail }
func (p *problem) Unwrap() error { return p.cause }

func invalid(format string, args ...any) *problem {
	return &problem{status: http.StatusBadRequest, code: codeInvalidRequest, detail: fmt.Sprintf(format, args...)}
}

// unavailableRetry is what a client is told to wait when the store is down.
const unavailableRetry = time.Second

// toProblem is the one place where errors become HTTP statuses and problem codes.
func toProblem(err error) *problem {
	var p *problem
	if errors.As(err, &p) {
		return p
	}
	var busy *engine.InProgressError
	var he *echo.HTTPError
	var limited *auth.RateLimitedError
	var forbidden *auth.ForbiddenError
	var timeout *engine.StoreTimeoutError
	var overCap *engine.CapError
	var overQuota *engine.QuotaError
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return &problem{status: statusClientClosed, code: codeClientClosed, detail: "the caller went away", cause: err}
	case errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, engine.ErrUnavailable):
		// Writing the answer outlasted the write timeout: the client does not read. The
		// same error from the store's own connection is the store's, answered below.
		return &problem{status: statusClientClosed, code: codeClientClosed, detail: "the caller did not read its answer in time", cause: err}
	case errors.Is(err, engine.ErrResultUnavailable):
		// The record is there, but the blob of its result is missing or not the
		// bytes stored: the result is never answered in part or altered.
		return &problem{status: http.StatusBadGateway, code: codeResultUnavailable, cause: err,
			detail: "the key's result is kept in the blob store, which does not hold it intact (missing, short or altered); the record is unchanged, and no part of the result was answered"}
	case errors.Is(err, auth.ErrMissingToken):
		return &problem{status: http.StatusUnauthorized, code: codeUnauthenticated, challenge: `Bearer realm="idemd"`,
			detail: "send Authorization: Bearer <token>"}
	case errors.Is(err, auth.ErrUnknownToken):
		return &problem{status: http.StatusUnauthorized, code: codeUnauthenticated, challenge: `Bearer realm="idemd", error="invalid_token"`,
			detail: "the bearer token is not known"}
	case errors.As(err, &forbidden):
		return &problem{status: http.StatusForbidden, code: codeForbidden,
			detail: fmt.Sprintf("this token does not have the %s scope, which this operation needs", forbidden.Need)}
	case errors.As(err, &limited):
		return &problem{status: http.StatusTooManyRequests, code: codeRateLimited, retryAfter: limited.RetryAfter,
			detail: "the tenant is over its request rate"}
	case errors.As(err, &overCap) && overCap.Field == "response":
		return &problem{status: http.StatusRequestEntityTooLarge, code: codePayloadTooLarge, detail: overCap.Error()}
	case errors.As(err, &overCap):
		return invalid("%s", overCap.Error())
	case errors.As(err, &overQuota):
		return &problem{status: http.StatusTooManyRequests, code: codeQuotaExceeded, retryAfter: overQuota.RetryAfter, quota: overQuota,
			detail: fmt.Sprintf("the tenant keeps %d of its %s of %d: new keys are refused until records expire or are purged; replays, lookups and leases already granted still work",
				overQuota.Used, overQuota.Field, overQuota.Limit)}
	case errors.As(err, &busy):
		return &problem{status: http.StatusConflict, code: codeInProgress, retryAfter: max(busy.RetryAfter, 0),
			detail: "another caller holds a live lease on this key; retry after it runs out, or claim with wait_ms"}
	case errors.Is(err, engine.ErrFingerprintMismatch):
		return &problem{status: http.StatusUnprocessableEntity, code: codeFingerprintMismatch,
			detail: "fingerprint: this key was first used with a different fingerprint (payload)"}
	case errors.Is(err, engine.ErrLeaseLost):
		return &problem{status: http.StatusConflict, code: codeLeaseLost,
			detail: "lease_token: not the key's current lease (released, finished, or taken over after expiry)"}
	case errors.Is(err, engine.ErrNoBackup):
		return &problem{status: http.StatusNotImplemented, code: codeNotSupported,
			detail: "this daemon's store keeps no file of its own to back up: back a Redis up with its own persistence (docs/backup.md, Backup and restore), or export its records"}
	case errors.Is(err, engine.ErrNoPorter):
		return &problem{status: http.StatusNotImplemented, code: codeNotSupported, detail: "this daemon's store cannot export or import records"}
	case errors.Is(err, engine.ErrBadCursor):
		return invalid("cursor is not a next_cursor of this feed for this prefix")
	case errors.Is(err, engine.ErrNotFound):
		return &problem{status: http.StatusNotFound, code: codeNotFound, detail: "key: no record for this key"}
	case errors.Is(err, engine.ErrStoreMoved):
		// Not an outage, and not an answer about the key: its record is in another
		// store, which a daemon serving (or moving to) that store answers from.
		return &problem{status: http.StatusServiceUnavailable, code: codeStoreMoved, retryAfter: unavailableRetry,
			detail: "the key's record has moved to another store that this daemon does not serve; nothing was acquired or changed, retry (a daemon of the new store answers it)"}
	case errors.Is(err, engine.ErrNotReplicated):
		return &problem{status: http.StatusServiceUnavailable, code: codeNotReplicated, retryAfter: unavailableRetry, cause: err,
			detail: "the write was not confirmed by enough replicas in time; it may or may not have taken effect"}
	case errors.As(err, &timeout):
		return &problem{status: http.StatusServiceUnavailable, code: codeStoreUnavailable, retryAfter: unavailableRetry, cause: err,
			detail: fmt.Sprintf("the store did not answer within %s; a write may or may not have taken effect", timeout.Timeout)}
	case errors.Is(err, engine.ErrUnavailable):
		return &problem{status: http.StatusServiceUnavailable, code: codeStoreUnavailable, retryAfter: unavailableRetry, cause: err,
			detail: "the store is unavailable; nothing was acquired"}
	case errors.As(err, &he):
		switch he.Code {
		case http.StatusNotFound:
			return &problem{status: he.Code, code: codeNotFound, detail: "no such endpoint"}
		case http.StatusMethodNotAllowed:
			return &problem{status: he.Code, code: codeMethodNotAllowed, detail: "method not allowed on this endpoint"}
		case http.StatusRequestEntityTooLarge:
			return &problem{status: he.Code, code: codePayloadTooLarge, detail: "request body too large"}
		}
		if he.Code >= 400 && he.Code < 500 {
			return &problem{status: he.Code, code: codeInvalidRequest, detail: fmt.Sprint(he.Message)}
		}
	}
	return &problem{status: http.StatusInternalServerError, code: codeInternal, detail: "internal error", cause: err}
}

func (s *Server) handleError(err error, c echo.Context) {
	p := toProblem(err)
	setOutcome(c, string(p.code))
	s.noteProblem(s.endpointOf(c), p, err)
	if c.Response().Committed {
		return
	}
	body := p.body()
	if p.retryAfter > 0 {
		// Retry-After counts whole seconds; round up so a client never comes back early.
		c.Response().Header().Set("Retry-After", strconv.FormatInt(int64((p.retryAfter+time.Second-1)/time.Second), 10))
	}
	if p.challenge != "" {
		c.Response().Header().Set(echo.HeaderWWWAuthenticate, p.challenge)
	}
	c.Response().Header().Set(echo.HeaderContentType, "application/problem+json")
	c.Response().WriteHeader(p.status)
	_ = s.encode(c, body)
}

// noteProblem counts a store failure against endpoint and logs a server-side failure.
func (s *Server) noteProblem(endpoint string, p *problem, err error) {
	if p.code == codeStoreUnavailable || p.code == codeNotReplicated {
		s.metrics.storeErrors.WithLabelValues(endpoint).Inc()
	}
	if p.status >= 500 {
		s.log.Warn("request failed", "endpoint", endpoint, "code", p.code, "err", err)
	}
}

// body is the problem as the contract's Problem document.
func (p *problem) body() api.Problem {
	body := api.Problem{
		Type:   "urn:idemd:problem:" + string(p.code),
		Title:  http.StatusText(p.status),
		Status: p.status,
		Code:   string(p.code),
	}
	if p.detail != "" {
		body.Detail = &p.detail
	}
	if p.retryAfter > 0 {
		ms := p.retryAfter.Milliseconds()
		body.RetryAfterMs = &ms
	}
	if q := p.quota; q != nil {
		body.Quota = &api.QuotaUsage{Limit: q.Field, Used: q.Used, Max: q.Limit,
			Records: q.Usage.Records, StoredBytes: q.Usage.Bytes}
	}
	return body
}
