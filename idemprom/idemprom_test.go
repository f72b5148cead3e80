package idemprom_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/idemprom"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pebblestore"
	"github.com/idemkv/idem/pgstore"
)

// TestMain stops the PostgreSQL that pgtest may start for
// TestCollectorOnPostgres.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// gather collects reg and indexes the families by name.
func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	byName := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
	}
	return byName
}

// value is the value of the family's only series, counter or gauge.
func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	mf, ok := mfs[name]
	require.True(t, ok, "no family %s", name)
	require.Len(t, mf.GetMetric(), 1, name)
	m := mf.GetMetric()[0]
	switch mf.GetType() {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	}
	require.FailNow(t, "not a counter or gauge", name)
	return 0
}

// labelled finds the series of mf whose labels are exactly labels.
func labelled(mf *dto.MetricFamily, labels map[string]string) *dto.Metric {
	for _, m := range mf.GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		if len(got) == len(labels) {
			same := true
			for k, v := range labels {
				same = same && got[k] == v
			}
			if same {
				return m
			}
		}
	}
	return nil
}

func TestCollector(t *testing.T) {
	db, clock := idemtest.Open(t, nil)
	reg := prometheus.NewRegistry()
	c, err := idemprom.NewCollector(db, nil)
	require.NoError(t, err)
	require.NoError(t, reg.Register(c))

	// Nothing happened yet: every series is there, at zero.
	mfs := gather(t, reg)
	assert.Equal(t, 0.0, value(t, mfs, "idem_claims_total"))
	assert.Equal(t, 0.0, value(t, mfs, "idem_replay_ratio"), "no division by zero")

	ctx := context.Background()
	s := idem.Scope{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "k1"}
	fp := idem.Fingerprint(sha256.Sum256([]byte("a")))
	other := idem.Fingerprint(sha256.Sum256([]byte("b")))

	lease, _, err := db.Claim(ctx, s, fp)
	require.NoError(t, err)
	_, _, err = db.Claim(ctx, s, fp)
	require.ErrorIs(t, err, idem.ErrInProgress)
	clock.Advance(3 * time.Second)
	mfs = gather(t, reg)
	assert.Equal(t, 1.0, value(t, mfs, "idem_in_progress_records"))
	assert.Equal(t, 3.0, value(t, mfs, "idem_oldest_in_progress_age_seconds"))

	require.NoError(t, lease.Complete(ctx, idem.Response{Status: 201, Body: []byte("{}")}))
	for range 2 {
		_, replay, err := db.Claim(ctx, s, fp)
		require.NoError(t, err)
		require.NotNil(t, replay)
	}
	_, _, err = db.Claim(ctx, s, other)
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)

	// A second operation that commits nothing, and a third whose outcome
	// is lost.
	released, _, err := db.Claim(ctx, idem.Scope{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "k2"}, fp)
	require.NoError(t, err)
	require.NoError(t, released.Release(ctx))
	lost := idem.Scope{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "k3"}
	unknown, _, err := db.Claim(ctx, lost, fp)
	require.NoError(t, err)
	require.NoError(t, unknown.MarkUnknown(ctx))
	_, _, err = db.Claim(ctx, lost, fp)
	require.ErrorIs(t, err, idem.ErrOutcomePending)

	mfs = gather(t, reg)
	want := map[string]float64{
		"idem_claims_total":          3,
		"idem_replays_total":         2,
		"idem_conflicts_total":       1,
		"idem_mismatches_total":      1,
		"idem_outcome_pending_total": 1,
		"idem_completions_total":     1,
		"idem_releases_total":        1,
		"idem_unknowns_total":        1,
		"idem_failures_total":        0,
		"idem_reconciled_total":      0,
		"idem_in_progress_records":   0,
		"idem_overdue_records":       0,
		"idem_unknown_records":       1,
		"idem_failed_records":        0,
		"idem_expired_records":       0,
		"idem_replay_ratio":          2.0 / 5.0,
	}
	for name, v := range want {
		assert.Equal(t, v, value(t, mfs, name), name)
	}
	assert.Equal(t, 0.0, value(t, mfs, "idem_oldest_in_progress_age_seconds"))
	assert.Positive(t, value(t, mfs, "idem_commits_total"))
	assert.Positive(t, value(t, mfs, "idem_wal_syncs_total"))
	assert.Positive(t, value(t, mfs, "idem_disk_usage_bytes"))
	for _, name := range []string{"idem_claims_total", "idem_swept_records_total", "idem_reclaimed_bytes_total", "idem_pebble_flushes_total"} {
		assert.Equal(t, dto.MetricType_COUNTER, mfs[name].GetType(), name)
	}
	for _, name := range []string{"idem_in_progress_records", "idem_read_amplification", "idem_replay_ratio"} {
		assert.Equal(t, dto.MetricType_GAUGE, mfs[name].GetType(), name)
	}
	assert.NotContains(t, mfs, "idem_store_metrics", "the error descriptor only appears on failure")
}

// TestCollectorOnPostgres: the collector takes any idem.Operator. On
// pgstore it exports the contract's series, counted the same way, beside
// pgstore's own figures.
func TestCollectorOnPostgres(t *testing.T) {
	ctx := context.Background()
	db, err := pgstore.Open(ctx, pgtest.DSN(t), nil)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	reg := prometheus.NewRegistry()
	c, err := idemprom.NewCollector(db, nil)
	require.NoError(t, err)
	require.NoError(t, reg.Register(c))
	assert.Equal(t, 0.0, value(t, gather(t, reg), "idem_claims_total"))

	s := idem.Scope{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "k1"}
	fp := idem.Fingerprint(sha256.Sum256([]byte("a")))
	lease, _, err := db.Claim(ctx, s, fp)
	require.NoError(t, err)
	mfs := gather(t, reg)
	assert.Equal(t, 1.0, value(t, mfs, "idem_claims_total"))
	assert.Equal(t, 1.0, value(t, mfs, "idem_in_progress_records"))

	require.NoError(t, lease.Complete(ctx, idem.Response{Status: 201, Body: []byte("{}")}))
	_, replay, err := db.Claim(ctx, s, fp)
	require.NoError(t, err)
	require.NotNil(t, replay)
	mfs = gather(t, reg)
	for name, v := range map[string]float64{
		"idem_claims_total":        1,
		"idem_replays_total":       1,
		"idem_completions_total":   1,
		"idem_in_progress_records": 0,
		"idem_replay_ratio":        0.5,
	} {
		assert.Equal(t, v, value(t, mfs, name), name)
	}
	assert.Positive(t, value(t, mfs, "idem_pg_table_bytes"))
	assert.Equal(t, 1.0, value(t, mfs, "idem_pg_listener_connected"))
	assert.Equal(t, dto.MetricType_GAUGE, mfs["idem_pg_table_bytes"].GetType())
	assert.NotContains(t, mfs, "idem_disk_usage_bytes", "Pebble's figures belong to the embedded store")
}

func TestCollectorExpiry(t *testing.T) {
	db, clock := idemtest.Open(t, &pebblestore.Options{TTL: time.Hour})
	reg := prometheus.NewRegistry()
	c, err := idemprom.NewCollector(db, nil)
	require.NoError(t, err)
	reg.MustRegister(c)
	ctx := context.Background()
	lease, _, err := db.Claim(ctx, idem.Scope{Tenant: "t", Endpoint: "e", Key: "k"}, idem.Fingerprint{1})
	require.NoError(t, err)
	require.NoError(t, lease.Complete(ctx, idem.Response{Status: 200}))
	clock.Advance(2 * time.Hour)
	assert.Equal(t, 1.0, value(t, gather(t, reg), "idem_expired_records"))
}

func TestCollectorClosedStore(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	reg := prometheus.NewRegistry()
	c, err := idemprom.NewCollector(db, nil)
	require.NoError(t, err)
	require.NoError(t, reg.Register(c))
	require.NoError(t, db.Close())

	var mfs []*dto.MetricFamily
	require.NotPanics(t, func() { mfs, err = reg.Gather() })
	require.Error(t, err)
	assert.ErrorIs(t, err, idem.ErrClosed)
	assert.Contains(t, err.Error(), "idemprom: reading the store's metrics")
	assert.Empty(t, mfs, "no stale values")
}

func TestNewCollectorOptions(t *testing.T) {
	_, err := idemprom.NewCollector(nil, nil)
	assert.ErrorIs(t, err, idem.ErrInvalidOptions)
	assert.Contains(t, err.Error(), "idemprom: NewCollector needs a store")
	db, _ := idemtest.Open(t, nil)
	_, err = idemprom.NewCollector(db, &idemprom.CollectorOptions{Timeout: -time.Second})
	assert.ErrorIs(t, err, idem.ErrInvalidOptions)
}

// stalled is a store whose metrics, once stall is set, never come: a
// store whose server stopped answering.
type stalled struct {
	idem.Operator
	stall atomic.Bool
}

func (s *stalled) Metrics(ctx context.Context) (idem.Metrics, error) {
	if s.stall.Load() {
		<-ctx.Done()
		return idem.Metrics{}, ctx.Err()
	}
	return s.Operator.Metrics(ctx)
}

// TestScrapeTimeout: a scrape of a store that does not answer ends at the
// collector's timeout with a scrape error, instead of holding the scraper.
func TestScrapeTimeout(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	s := &stalled{Operator: db}
	c, err := idemprom.NewCollector(s, &idemprom.CollectorOptions{Timeout: time.Millisecond})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	s.stall.Store(true)
	_, err = reg.Gather()
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestObserver(t *testing.T) {
	obs, err := idemprom.NewObserver(nil)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(obs))

	pay := "POST /v1/payments"
	for _, o := range []idem.Observation{
		{Endpoint: pay, Outcome: idem.OutcomeExecuted, Status: 201, Duration: 40 * time.Millisecond},
		{Endpoint: pay, Outcome: idem.OutcomeExecuted, Status: 400, Duration: 2 * time.Millisecond},
		{Endpoint: pay, Outcome: idem.OutcomeReplayed, Status: 201, Duration: time.Millisecond / 2},
		{Endpoint: pay, Outcome: idem.OutcomeReplayed, Status: 201, Duration: time.Millisecond / 2},
		{Endpoint: pay, Outcome: idem.CodeInProgress, Status: 409},
		{Endpoint: pay, Outcome: idem.CodeKeyReuse, Status: 422},
		{Endpoint: "POST /v1/refunds", Outcome: idem.CodeKeyMissing, Status: 400},
	} {
		obs.Observe(o)
	}

	mfs := gather(t, reg)
	requests := mfs["idem_http_requests_total"]
	require.NotNil(t, requests)
	cases := []struct {
		endpoint, outcome, code string
		n                       float64
	}{
		{pay, "executed", "201", 1},
		{pay, "executed", "400", 1},
		{pay, "replayed", "201", 2},
		{pay, "request_in_progress", "409", 1},
		{pay, "idempotency_key_reuse", "422", 1},
		{"POST /v1/refunds", "idempotency_key_missing", "400", 1},
	}
	assert.Len(t, requests.GetMetric(), len(cases))
	for _, c := range cases {
		m := labelled(requests, map[string]string{"endpoint": c.endpoint, "outcome": c.outcome, "code": c.code})
		if assert.NotNil(t, m, "%+v", c) {
			assert.Equal(t, c.n, m.GetCounter().GetValue(), "%+v", c)
		}
	}

	durations := mfs["idem_http_request_duration_seconds"]
	require.NotNil(t, durations)
	assert.Equal(t, dto.MetricType_HISTOGRAM, durations.GetType())
	executed := labelled(durations, map[string]string{"endpoint": pay, "outcome": "executed"})
	require.NotNil(t, executed)
	assert.Equal(t, uint64(2), executed.GetHistogram().GetSampleCount())
	assert.InDelta(t, 0.042, executed.GetHistogram().GetSampleSum(), 1e-9)
	replayed := labelled(durations, map[string]string{"endpoint": pay, "outcome": "replayed"})
	require.NotNil(t, replayed)
	assert.Equal(t, uint64(2), replayed.GetHistogram().GetBucket()[0].GetCumulativeCount(), "half a millisecond is in the first bucket")
}

// TestObserverEndpointBound: endpoints named by raw paths cannot grow the
// series without bound, and odd bytes in a path do not panic.
func TestObserverEndpointBound(t *testing.T) {
	obs, err := idemprom.NewObserver(&idemprom.ObserverOptions{MaxEndpoints: 2})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(obs))
	for _, ep := range []string{"POST /a", "POST /b", "POST /c", "POST /a", "POST /d\xff"} {
		require.NotPanics(t, func() {
			obs.Observe(idem.Observation{Endpoint: ep, Outcome: idem.OutcomeExecuted, Status: http.StatusOK})
		})
	}
	requests := gather(t, reg)["idem_http_requests_total"]
	count := func(ep string) float64 {
		m := labelled(requests, map[string]string{"endpoint": ep, "outcome": "executed", "code": "200"})
		if m == nil {
			return 0
		}
		return m.GetCounter().GetValue()
	}
	assert.Equal(t, 2.0, count("POST /a"))
	assert.Equal(t, 1.0, count("POST /b"))
	assert.Equal(t, 2.0, count(idemprom.OtherEndpoint))
	assert.Len(t, requests.GetMetric(), 3)
}

// TestObserverUnrouted: through the middleware, a request no route
// pattern matched is labelled other, whatever IDs its path holds, and
// uses none of the labelled endpoints' room; a routed one keeps its
// pattern.
func TestObserverUnrouted(t *testing.T) {
	obs, err := idemprom.NewObserver(&idemprom.ObserverOptions{MaxEndpoints: 1})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(obs))
	db, _ := idemtest.Open(t, nil)
	mw, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: func(*http.Request) (string, error) { return "t", nil }, Observe: obs.Observe})
	require.NoError(t, err)
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", mw(ok))
	unrouted := mw(ok) // around a whole handler, as idem proxy has it
	for i, path := range []string{"/v1/orders/1", "/v1/orders/2", "/v1/payments", "/v1/orders/3"} {
		r := httptest.NewRequest(http.MethodPost, path, nil)
		r.Header.Set("Idempotency-Key", fmt.Sprint("k", i))
		if path == "/v1/payments" {
			mux.ServeHTTP(httptest.NewRecorder(), r)
		} else {
			unrouted.ServeHTTP(httptest.NewRecorder(), r)
		}
	}
	requests := gather(t, reg)["idem_http_requests_total"]
	require.NotNil(t, requests)
	for ep, n := range map[string]float64{idemprom.OtherEndpoint: 3, "POST /v1/payments": 1} {
		m := labelled(requests, map[string]string{"endpoint": ep, "outcome": "executed", "code": "201"})
		if assert.NotNil(t, m, ep) {
			assert.Equal(t, n, m.GetCounter().GetValue(), ep)
		}
	}
	assert.Len(t, requests.GetMetric(), 2)
}

func TestNewObserverValidates(t *testing.T) {
	_, err := idemprom.NewObserver(&idemprom.ObserverOptions{Buckets: []float64{0.1, 0.1, -1}, MaxEndpoints: -1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "idemprom: ObserverOptions.Buckets[1] 0.1 must be larger")
	assert.Contains(t, err.Error(), "idemprom: ObserverOptions.Buckets[2] -1 must be a positive")
	assert.Contains(t, err.Error(), "idemprom: ObserverOptions.MaxEndpoints -1")
	_, err = idemprom.NewObserver(&idemprom.ObserverOptions{Buckets: []float64{}})
	assert.ErrorIs(t, err, idem.ErrInvalidOptions)
	assert.EqualError(t, err, "idem: invalid options: idemprom: ObserverOptions.Buckets is empty")
}

// TestRegisterTwice: each constructor call owns its series, so two on one
// registry collide the way Prometheus reports it, instead of sharing
// hidden global state.
func TestRegisterTwice(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	reg := prometheus.NewRegistry()
	c1, err := idemprom.NewCollector(db, nil)
	require.NoError(t, err)
	c2, err := idemprom.NewCollector(db, nil)
	require.NoError(t, err)
	require.NoError(t, reg.Register(c1))
	var already prometheus.AlreadyRegisteredError
	assert.ErrorAs(t, reg.Register(c2), &already)
	// On another registry it is fine.
	assert.NoError(t, prometheus.NewRegistry().Register(c2))
}
