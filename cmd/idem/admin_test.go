package main

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/internal/idemtest"
)

// TestAdminStoreDown: the running binaries close the store only after the
// admin listener, so a store that cannot be read is tested in process.
func TestAdminStoreDown(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	var logged bytes.Buffer
	adm, err := newAdmin(db, slog.New(slog.NewTextHandler(&logged, nil)))
	require.NoError(t, err)
	mux := http.NewServeMux()
	adm.register(mux, &adminGuard{})
	get := func(path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec
	}

	up := get("/healthz")
	assert.Equal(t, http.StatusOK, up.Code)
	assert.Equal(t, "ok\n", up.Body.String())
	assert.Contains(t, get("/metrics").Body.String(), "idem_claims_total 0")

	require.NoError(t, db.Close())
	down := get("/healthz")
	assert.Equal(t, http.StatusServiceUnavailable, down.Code)
	assert.Equal(t, "store closed\n", down.Body.String())
	assert.Contains(t, logged.String(), "health check failed")

	// The store's series are gone, not frozen; the process's remain, and
	// the failure is counted.
	metrics := get("/metrics")
	assert.Equal(t, http.StatusOK, metrics.Code)
	assert.NotContains(t, metrics.Body.String(), "idem_claims_total")
	assert.Contains(t, metrics.Body.String(), "go_goroutines")
	// The handler counts a failure after gathering, so the next scrape
	// shows it.
	assert.Contains(t, get("/metrics").Body.String(), `promhttp_metric_handler_errors_total{cause="gathering"} 1`)
	assert.Contains(t, logged.String(), "idemprom: reading the store's metrics")
}
