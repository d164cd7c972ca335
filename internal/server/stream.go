package server

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemd/idemd/internal/api"
	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
)

// maxKeptListed bounds the kept records an import's answer names.
const maxKeptListed = 1000

// everyTenant says whether the caller moves the records of every tenant: a token with
// the platform scope, or any caller of an open daemon, which has one key space.
func (s *Server) everyTenant(c echo.Context) bool {
	return s.auth == nil || principalOf(c).Can(auth.ScopePlatform)
}

// ExportRecords implements GET /v1/admin/records. The stream may take longer than the
// write timeout: each write gets the timeout anew, so that a reader that stops
// reading is still cut off.
func (s *Server) ExportRecords(c echo.Context) error {
	all, own := s.everyTenant(c), tenant(c)
	w := &renewingWriter{w: c.Response(), rc: http.NewResponseController(c.Response().Writer), timeout: s.writeTimeout}
	c.Response().Header().Set(echo.HeaderContentType, "application/x-ndjson")
	setOutcome(c, "ok")
	c.Response().WriteHeader(http.StatusOK)
	sw, err := engine.NewStreamWriter(w, "", time.Now())
	if err != nil {
		return err
	}
	err = s.engine.Export(c.Request().Context(), func(e engine.Exported) error {
		if !all && e.ID.Tenant != own {
			return nil
		}
		return sw.Write(e)
	})
	if err == nil {
		err = sw.Close()
	}
	if err != nil {
		// The answer has begun: the stream ends without its trailer, which its reader
		// takes as cut short.
		s.log.Error("export ended early", "err", err, "tenant", own)
		setOutcome(c, string(toProblem(err).code))
	}
	return nil
}

// renewingWriter gives each write the write timeout anew.
type renewingWriter struct {
	w       io.Writer
	rc      *http.ResponseController
	timeout time.Duration
}

func (r *renewingWriter) Write(p []byte) (int, error) {
	_ = r.rc.SetWriteDeadline(time.Now().Add(r.timeout))
	n, err := r.w.Write(p)
	if err == nil {
		err = r.rc.Flush()
	}
	return n, err
}

// renewingReader gives each read of the body the body timeout anew: a stream may take
// long, a stalled sender does not.
type renewingReader struct {
	r       io.Reader
	rc      *http.ResponseController
	timeout time.Duration
}

func (r *renewingReader) Read(p []byte) (int, error) {
	_ = r.rc.SetReadDeadline(time.Now().Add(r.timeout))
	return r.r.Read(p)
}

// ImportRecords implements POST /v1/admin/records.
func (s *Server) ImportRecords(c echo.Context) error {
	all, own := s.everyTenant(c), tenant(c)
	body := &renewingReader{r: c.Request().Body, rc: http.NewResponseController(c.Response().Writer), timeout: s.bodyTimeout}
	sr, err := engine.NewStreamReader(body, int(s.bodyLimit))
	if err != nil {
		return streamProblem(err)
	}
	var sum api.ImportSummary
	var kept []api.KeptRecord
	for {
		e, err := sr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return streamProblem(err, sum)
		}
		if !all && e.ID.Tenant != own {
			sum.OtherTenant++
			continue
		}
		var tenantCaps engine.Caps
		if l, ok := s.tenantLimits(e.ID.Tenant); ok {
			tenantCaps = capsOf(l)
		}
		outcome, err := s.engine.Import(c.Request().Context(), e, tenantCaps)
		var overQuota *engine.QuotaError
		if errors.As(err, &overQuota) {
			// The import stops at the first record past a quota, saying what it wrote
			// before: importing again once there is room writes the rest.
			p := toProblem(err)
			p.detail = fmt.Sprintf("tenant %s: %s%s", e.ID.Tenant, p.detail, counts(sum))
			return p
		}
		if err != nil {
			return err
		}
		switch outcome {
		case engine.ImportWritten:
			sum.Written++
		case engine.ImportSame:
			sum.Same++
		case engine.ImportExpired:
			sum.Expired++
		case engine.ImportKept:
			sum.Kept++
			if len(kept) < maxKeptListed {
				k := api.KeptRecord{Tenant: e.ID.Tenant, KeySha256: hex.EncodeToString(e.KeyDigest[:])}
				if e.ID.Key != "" {
					k.Key = &e.ID.Key
				}
				kept = append(kept, k)
			}
		}
	}
	if len(kept) > 0 {
		sum.KeptRecords = &kept
	}
	return s.reply(c, answer{status: http.StatusOK, outcome: "ok", body: sum})
}

// streamProblem is a stream that cannot be read, with what was imported before it.
func streamProblem(err error, sum ...api.ImportSummary) error {
	if !errors.Is(err, engine.ErrStream) {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return &problem{status: http.StatusRequestEntityTooLarge, code: codePayloadTooLarge, detail: err.Error()}
		}
		return err
	}
	detail := "body: " + err.Error()
	if len(sum) > 0 {
		detail += counts(sum[0])
	}
	return invalid("%s", detail)
}

func counts(sum api.ImportSummary) string {
	return fmt.Sprintf("; before it %d records were written, %d were there already, %d kept the store's own, %d had expired (importing again is safe)",
		sum.Written, sum.Same, sum.Kept, sum.Expired)
}

// BackupTrailer is the HTTP trailer of a backup that carries the SHA-256 of the copy,
// in hex, known only once the copy is sent.
const BackupTrailer = "Idemd-Backup-Sha256"

// Backup implements GET /v1/admin/backup. The copy holds every tenant's records: it
// needs the platform scope beside admin, or an open daemon.
func (s *Server) Backup(c echo.Context) error {
	if !s.everyTenant(c) {
		return &auth.ForbiddenError{Need: auth.ScopePlatform}
	}
	w := &renewingWriter{w: c.Response(), rc: http.NewResponseController(c.Response().Writer), timeout: s.writeTimeout}
	h := sha256.New()
	_, err := s.engine.Backup(c.Request().Context(), io.MultiWriter(w, h), func(size int64) {
		header := c.Response().Header()
		header.Set(echo.HeaderContentType, "application/octet-stream")
		header.Set("Idemd-Backup-Bytes", strconv.FormatInt(size, 10))
		header.Set("Trailer", BackupTrailer)
		setOutcome(c, "ok")
		c.Response().WriteHeader(http.StatusOK)
	})
	if err != nil && !c.Response().Committed {
		return err
	}
	if err != nil {
		// Without the trailer its reader knows the copy for cut short.
		s.log.Error("backup ended early", "err", err)
		setOutcome(c, string(toProblem(err).code))
		return nil
	}
	c.Response().Header().Set(BackupTrailer, hex.EncodeToString(h.Sum(nil)))
	return nil
}
