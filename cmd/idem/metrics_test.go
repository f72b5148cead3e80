package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
)

// waitStderr waits until the process has written s to standard error. The
// events are written by the request goroutines, so polling is the only way
// to see them; it decides nothing by itself passing.
func (d *daemon) waitStderr(s string) {
	d.t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(guard)
	for !strings.Contains(d.stderr.String(), s) {
		select {
		case <-tick.C:
		case <-d.done:
			require.Contains(d.t, d.stderr.String(), s, "the daemon exited")
			return
		case <-timeout:
			require.FailNowf(d.t, "timed out", "waiting for %q on stderr:\n%s", s, d.stderr.String())
		}
	}
}

var adminLine = regexp.MustCompile(`admin on (https?://\S+) \(/metrics, /healthz\)$`)

// adminURL is where the proxy serves /metrics and /healthz.
func (d *daemon) adminURL() string {
	d.t.Helper()
	m := adminLine.FindStringSubmatch(d.waitLine("admin on"))
	require.NotNil(d.t, m)
	return m[1]
}

// scrape fetches and parses the Prometheus text at url.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	r := send(t, "GET", url, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Contains(t, r.header.Get("Content-Type"), "text/plain")
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
	require.NoError(t, err, "%s", r.body)
	return mfs
}

// series returns the series of family name with exactly these labels
// (pairs of name, value), or nil.
func series(mfs map[string]*dto.MetricFamily, name string, labels ...string) *dto.Metric {
	for _, m := range mfs[name].GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		match := len(got) == len(labels)/2
		for i := 0; match && i+1 < len(labels); i += 2 {
			match = got[labels[i]] == labels[i+1]
		}
		if match {
			return m
		}
	}
	return nil
}

// scalar is the value of an unlabelled counter or gauge.
func scalar(t *testing.T, mfs map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	m := series(mfs, name)
	require.NotNil(t, m, "no series %s", name)
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

// requestsTotal sums idem_http_requests_total over every label.
func requestsTotal(mfs map[string]*dto.MetricFamily) float64 {
	var n float64
	for _, m := range mfs["idem_http_requests_total"].GetMetric() {
		n += m.GetCounter().GetValue()
	}
	return n
}

// scrapeAll scrapes url until the middleware has counted n requests. A
// response can reach the client a moment before the middleware counts it
// (a proxied one streams), so the first scrape may be early.
func scrapeAll(t *testing.T, url string, n float64) map[string]*dto.MetricFamily {
	t.Helper()
	deadline := time.Now().Add(guard)
	for {
		mfs := scrape(t, url)
		if requestsTotal(mfs) >= n || time.Now().After(deadline) {
			require.Equal(t, n, requestsTotal(mfs), "requests counted")
			return mfs
		}
	}
}

// outcome is one expected idem_http_requests_total series.
type outcome struct {
	endpoint, outcome, code string
	n                       float64
}

func assertOutcomes(t *testing.T, mfs map[string]*dto.MetricFamily, want []outcome) {
	t.Helper()
	assert.Len(t, mfs["idem_http_requests_total"].GetMetric(), len(want))
	hist := map[[2]string]uint64{}
	for _, w := range want {
		m := series(mfs, "idem_http_requests_total", "endpoint", w.endpoint, "outcome", w.outcome, "code", w.code)
		if assert.NotNil(t, m, "%+v", w) {
			assert.Equal(t, w.n, m.GetCounter().GetValue(), "%+v", w)
		}
		hist[[2]string{w.endpoint, w.outcome}] += uint64(w.n)
	}
	assert.Len(t, mfs["idem_http_request_duration_seconds"].GetMetric(), len(hist))
	for k, n := range hist {
		m := series(mfs, "idem_http_request_duration_seconds", "endpoint", k[0], "outcome", k[1])
		if assert.NotNil(t, m, "histogram %v", k) {
			assert.Equal(t, n, m.GetHistogram().GetSampleCount(), "histogram %v", k)
		}
	}
}

// assertEvents checks that stderr has one event line of each name for the
// key, identified by its hash, and that no key appears in the clear.
func assertEvents(t *testing.T, stderr, key string, names ...string) {
	t.Helper()
	hash := "key_hash=" + idem.KeyHash(key)
	for _, name := range names {
		found := false
		for line := range strings.Lines(stderr) {
			if strings.Contains(line, "level=INFO") && strings.Contains(line, `msg="idem: `+name+`"`) &&
				strings.Contains(line, " event="+name+" ") && strings.Contains(line, hash) {
				found = true
				break
			}
		}
		assert.True(t, found, "no %s event with %s in stderr:\n%s", name, hash, stderr)
	}
}

// TestProxyMetrics runs each outcome of the contract once through the
// proxy and finds it on --admin's /metrics, in the store's counters and
// in the events.
func TestProxyMetrics(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	routes := filepath.Join(t.TempDir(), "routes.json")
	require.NoError(t, os.WriteFile(routes, []byte(`{"POST /v1/payments": {}}`), 0o600))
	p := startProxy(t, u, "--routes", routes)
	admin := p.adminURL()

	blocked, key := newKey(), newKey()
	first := make(chan reply, 1)
	go func() {
		r, err := trySend(context.Background(), "POST", p.url+"/block", `{"amount": 1}`, keyed(blocked)...)
		assert.NoError(t, err)
		first <- r
	}()
	assert.Equal(t, blocked, <-u.started)
	assert.Equal(t, "request_in_progress", send(t, "POST", p.url+"/block", `{"amount": 1}`, keyed(blocked)...).code(t))

	created := send(t, "POST", p.url+"/v1/payments", `{"amount": 4200}`, keyed(key)...)
	require.Equal(t, http.StatusCreated, created.status, "%s", created.body)
	// The completion is logged before the answer leaves the proxy.
	sum := sha256.Sum256([]byte(auth))
	p.waitStderr("event=completed tenant=" + hex.EncodeToString(sum[:]) + ` endpoint="POST /v1/payments" key_hash=` + idem.KeyHash(key))
	assert.Equal(t, "true", send(t, "POST", p.url+"/v1/payments", `{"amount": 4200}`, keyed(key)...).header.Get("Idempotent-Replayed"))
	assert.Equal(t, "idempotency_key_reuse", send(t, "POST", p.url+"/v1/payments", `{"amount": 1}`, keyed(key)...).code(t))
	assert.Equal(t, "idempotency_key_missing", send(t, "POST", p.url+"/v1/payments", `{}`, "Authorization", auth).code(t))
	close(u.release)
	assert.Equal(t, http.StatusCreated, (<-first).status)

	mfs := scrapeAll(t, admin+"/metrics", 6)
	assertOutcomes(t, mfs, []outcome{
		// No route names /block: its path could hold an ID.
		{"other", "executed", "201", 1},
		{"other", "request_in_progress", "409", 1},
		{"POST /v1/payments", "executed", "201", 1},
		{"POST /v1/payments", "replayed", "201", 1},
		{"POST /v1/payments", "idempotency_key_reuse", "422", 1},
		{"POST /v1/payments", "idempotency_key_missing", "400", 1},
	})
	for name, v := range map[string]float64{
		"idem_claims_total": 2, "idem_replays_total": 1, "idem_conflicts_total": 1, "idem_mismatches_total": 1,
		"idem_completions_total": 2, "idem_outcome_pending_total": 0, "idem_in_progress_records": 0,
	} {
		assert.Equal(t, v, scalar(t, mfs, name), name)
	}
	assert.InDelta(t, 1.0/3, scalar(t, mfs, "idem_replay_ratio"), 1e-9)
	assert.Contains(t, mfs, "go_goroutines")
	assert.Contains(t, mfs, "process_resident_memory_bytes")

	health := send(t, "GET", admin+"/healthz", "")
	assert.Equal(t, http.StatusOK, health.status)
	assert.Equal(t, "ok\n", string(health.body))
	passed := send(t, "GET", p.url+"/healthz", "")
	assert.Equal(t, http.StatusCreated, passed.status, "on --listen the path is the upstream's")

	require.Equal(t, 0, p.stop(), p.stderr.String())
	stderr := p.stderr.String()
	assertEvents(t, stderr, blocked, "claimed", "conflict", "completed")
	assertEvents(t, stderr, key, "claimed", "completed", "replayed", "mismatch")
	for _, secret := range []string{blocked, key, "sk_test_alice"} {
		assert.NotContains(t, stderr, secret)
	}
}

// TestOperatorFlags: --events=false silences the events, an empty --admin
// opens no admin listener, and a taken --admin address is a failure.
func TestOperatorFlags(t *testing.T) {
	u := newUpstream(t)
	u.Start()
	p := startProxy(t, u, "--admin", "", "--events=false")
	key := newKey()
	require.Equal(t, http.StatusCreated, send(t, "POST", p.url+"/v1/payments", `{}`, keyed(key)...).status)
	require.Equal(t, "true", send(t, "POST", p.url+"/v1/payments", `{}`, keyed(key)...).header.Get("Idempotent-Replayed"))
	require.Equal(t, 0, p.stop(), p.stderr.String())
	assert.NotContains(t, p.stderr.String(), "event=")
	p.mu.Lock()
	assert.NotContains(t, strings.Join(p.stdout, "\n"), "admin on")
	p.mu.Unlock()

	// The admin address of a running proxy is taken.
	taken := startProxy(t, u)
	addr := strings.TrimPrefix(taken.adminURL(), "http://")
	r := runIdem(t, "", "proxy", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin", addr, "--upstream", u.URL)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "idem proxy: --admin:")
	assert.Empty(t, r.stdout)
}
