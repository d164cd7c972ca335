package server

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemd/idemd/internal/api"
	"github.com/idemd/idemd/internal/engine"
)

// MaxBatchItems is the contract's limit on the items of one batch.
const MaxBatchItems = 128

// batchEndpoint is the batch's route; each of its items takes from the tenant's rate
// budget on its own, so the request itself takes nothing.
const batchEndpoint = "POST /v1/batch"

// batchItem is one item of a batch on its way through: the endpoint whose single call
// it stands for, the key it works on, and either how to run it or why it is refused;
// then its result.
type batchItem struct {
	endpoint string
	key      string
	run      func(c echo.Context) (answer, error)
	refused  error
	result   api.BatchItemResult
}

// Batch implements POST /v1/batch: each item is validated and answered as its single
// call would be. Items on one key run one after the other in their order; items on
// different keys run concurrently, so that a store that gathers concurrent calls (the
// Redis store's pipelines, the embedded store's commits) serves the batch in as few
// round trips as it can.
func (s *Server) Batch(c echo.Context) error {
	release, err := s.admitBody(c)
	if err != nil {
		return err
	}
	defer release()
	var body api.BatchRequest
	if err := decodeJSON(c.Request(), c.Response(), s.bodyLimit, &body); err != nil {
		return err
	}
	if n := len(body.Items); n == 0 || n > MaxBatchItems {
		return invalid("items holds %d operations; a batch holds 1 to %d", n, MaxBatchItems)
	}
	items := make([]*batchItem, len(body.Items))
	for i, it := range body.Items {
		item, err := s.batchItem(tenant(c), i, it)
		if err != nil {
			return err
		}
		items[i] = item
	}

	p := principalOf(c)
	byKey := make(map[string][]*batchItem)
	var order []string
	for _, item := range items {
		if item.refused != nil {
			s.settle(c, item, answer{}, item.refused)
			continue
		}
		if err := p.Tenant.Allow(); err != nil {
			s.settle(c, item, answer{}, err)
			continue
		}
		if _, ok := byKey[item.key]; !ok {
			order = append(order, item.key)
		}
		byKey[item.key] = append(byKey[item.key], item)
	}
	var wg sync.WaitGroup
	for _, key := range order {
		wg.Go(func() {
			var down error
			for _, item := range byKey[key] {
				if down != nil {
					// One store deadline per key, not one per item: against a frozen
					// store, a batch of many items on one key would otherwise hold its
					// request for as many deadlines.
					s.settle(c, item, answer{}, down)
					continue
				}
				a, err := item.run(c)
				s.settle(c, item, a, err)
				if errors.Is(err, engine.ErrUnavailable) {
					down = &problem{status: http.StatusServiceUnavailable, code: codeStoreUnavailable,
						retryAfter: unavailableRetry, cause: err,
						detail: "not sent: an earlier item on this key found the store unavailable; nothing was acquired"}
				}
			}
		})
	}
	wg.Wait()

	out := api.BatchResults{Results: make([]api.BatchItemResult, len(items))}
	for i, item := range items {
		out.Results[i] = item.result
	}
	return s.reply(c, answer{http.StatusOK, "ok", out})
}

// batchItem validates item i of a batch. A batch that is not well formed (an item
// without exactly one operation) is refused whole; an item whose operation is not
// valid gets the problem its single call would get, naming the member in the batch.
func (s *Server) batchItem(tenant string, i int, it api.BatchItem) (*batchItem, error) {
	n := 0
	for _, set := range []bool{it.Claim != nil, it.Complete != nil, it.Release != nil, it.Extend != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, invalid("items[%d] holds %d operations; it must hold exactly one of claim, complete, release or extend", i, n)
	}
	item := &batchItem{}
	var at string
	var err error
	switch {
	case it.Claim != nil:
		item.endpoint, item.key, at = claimEndpoint, it.Claim.Key, "claim"
		req, e := s.claimRequest(tenant, *it.Claim)
		if err = e; err == nil && req.Wait > 0 {
			err = invalid("wait_ms is %d; a claim in a batch does not wait: send a waiting claim on its own", req.Wait.Milliseconds())
		}
		item.run = func(c echo.Context) (answer, error) { return s.claim(c, req) }
	case it.Complete != nil:
		item.endpoint, item.key, at = "POST /v1/complete", it.Complete.Key, "complete"
		req, e := s.completion(tenant, *it.Complete)
		err = e
		item.run = func(c echo.Context) (answer, error) { return s.complete(c, req) }
	case it.Release != nil:
		item.endpoint, item.key, at = "POST /v1/release", it.Release.Key, "release"
		req, e := s.release(tenant, *it.Release)
		err = e
		item.run = func(c echo.Context) (answer, error) { return s.releaseKey(c, req) }
	default:
		item.endpoint, item.key, at = "POST /v1/extend", it.Extend.Key, "extend"
		req, e := s.extension(tenant, *it.Extend)
		err = e
		item.run = func(c echo.Context) (answer, error) { return s.extend(c, req) }
	}
	if err != nil {
		p := toProblem(err)
		named := *p
		named.detail = fmt.Sprintf("items[%d].%s.%s", i, at, p.detail)
		item.refused, item.run = &named, nil
	}
	return item, nil
}

// settle records an item's answer or error as its result, and counts it as the single
// call it stands for would be counted.
func (s *Server) settle(c echo.Context, item *batchItem, a answer, err error) {
	if err != nil {
		p := toProblem(err)
		s.noteProblem(item.endpoint, p, err)
		s.metrics.requests.WithLabelValues(item.endpoint, string(p.code), tenantLabel(c)).Inc()
		if item.endpoint == claimEndpoint {
			s.traffic.record(tenantLabel(c), string(p.code), time.Now(), -1)
		}
		body := p.body()
		item.result = api.BatchItemResult{Status: p.status, Problem: &body}
		return
	}
	s.metrics.requests.WithLabelValues(item.endpoint, a.outcome, tenantLabel(c)).Inc()
	if item.endpoint == claimEndpoint {
		s.traffic.record(tenantLabel(c), a.outcome, time.Now(), -1)
	}
	item.result = api.BatchItemResult{Status: a.status}
	switch v := a.body.(type) {
	case api.ClaimAcquired:
		item.result.Acquired = &v
	case api.ClaimFinished:
		item.result.Finished = &v
	case api.KeyRecord:
		item.result.Record = &v
	case api.LeaseExtended:
		item.result.Extended = &v
	default:
		panic(fmt.Sprintf("server: a batch item answered a %T", a.body))
	}
}
