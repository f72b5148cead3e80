package idemclient_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemclient"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/pebblestore"
)

// idemServer is the real server half of the contract: an idemhttp
// middleware over a handler that counts its executions. It can drop its
// next responses after the outcome is committed, the failure idempotency
// keys exist for.
type idemServer struct {
	db         *pebblestore.Store
	drops      atomic.Int32 // responses still to drop
	executions atomic.Int32 // times the operation really ran
	srv        *httptest.Server
}

const tenant = "acme"

func newIdemServer(t *testing.T, drops int32) *idemServer {
	t.Helper()
	db, _ := idemtest.Open(t, nil)
	s := &idemServer{db: db}
	s.drops.Store(drops)
	mw, err := idemhttp.New(idemhttp.Options{
		Store:  db,
		Tenant: func(*http.Request) (string, error) { return tenant, nil },
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	app := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.executions.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, n)
	}))
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.drops.Add(-1) < 0 {
			app.ServeHTTP(w, r)
			return
		}
		// Committed, but the client never hears about it.
		app.ServeHTTP(httptest.NewRecorder(), r)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func serverScope(key string) idem.Scope {
	return idem.Scope{Tenant: tenant, Endpoint: "POST /orders", Key: key}
}

func serverFingerprint(t *testing.T, body string) idem.Fingerprint {
	t.Helper()
	fp, err := idem.Request{Method: "POST", Path: "/orders", Tenant: tenant, ContentType: "application/json", Body: []byte(body)}.Fingerprint(idem.CanonicalOptions{})
	require.NoError(t, err)
	return fp
}

func TestEndToEndDroppedResponses(t *testing.T) {
	s := newIdemServer(t, 2)
	c := newFakeClock()
	client := &http.Client{Transport: newTransport(t, sleeping(c, &idemclient.Options{Base: noReuse(), Now: c.Now}))}

	resp, err := client.Do(post(t, context.Background(), s.srv.URL+"/orders", `{"sku":"tea","qty":2}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	assert.Equal(t, int32(1), s.executions.Load(), "exactly one execution")
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, `{"order":1}`, string(body))
	assert.True(t, idemclient.Replayed(resp), "the client sees the replay of the first execution")
	assert.Equal(t, 3, idemclient.Attempts(resp))
	rec, err := s.db.Get(context.Background(), serverScope(idemclient.Key(resp)))
	require.NoError(t, err)
	assert.Equal(t, idem.StateCompleted, rec.State)

	// The same key with another body is a client bug: 422, not retried.
	req := post(t, context.Background(), s.srv.URL+"/orders", `{"sku":"tea","qty":3}`)
	req.Header.Set(idem.HeaderKey, idemclient.Key(resp))
	resp2, err := client.Do(req)
	require.NoError(t, err)
	defer resp2.Body.Close()
	assert.Equal(t, http.StatusUnprocessableEntity, resp2.StatusCode)
	assert.Equal(t, idem.CodeKeyReuse, idemclient.ProblemCode(resp2))
	assert.Equal(t, 1, idemclient.Attempts(resp2))
	assert.Equal(t, int32(1), s.executions.Load())
}

// TestEndToEndInProgress: another holder has the key; the client waits out
// the server's Retry-After with the same key and gets the holder's outcome.
func TestEndToEndInProgress(t *testing.T) {
	s := newIdemServer(t, 0)
	const key, body = "held-key-1", `{"sku":"tea"}`
	lease, _, err := s.db.Claim(context.Background(), serverScope(key), serverFingerprint(t, body))
	require.NoError(t, err)
	require.NotNil(t, lease)

	c := newFakeClock()
	c.onSleep = func(n int) {
		if n == 1 { // the holder finishes while the client waits
			assert.NoError(t, lease.Complete(context.Background(), idem.Response{Status: http.StatusCreated, Body: []byte(`{"order":"held"}`)}))
		}
	}
	tr := newTransport(t, sleeping(c, &idemclient.Options{Base: noReuse(), Backoff: zeroBackoff, Now: c.Now}))
	req := post(t, context.Background(), s.srv.URL+"/orders", body)
	req.Header.Set(idem.HeaderKey, key)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, `{"order":"held"}`, string(got))
	assert.True(t, idemclient.Replayed(resp))
	assert.Equal(t, 2, idemclient.Attempts(resp))
	require.Len(t, c.Waits(), 1)
	assert.GreaterOrEqual(t, c.Waits()[0], time.Second, "Retry-After from the 409")
	assert.Equal(t, int32(0), s.executions.Load())
}

// TestEndToEndOutcomePending: an earlier attempt's outcome is unknown; the
// client must not hammer the server, and the operation stays open.
func TestEndToEndOutcomePending(t *testing.T) {
	s := newIdemServer(t, 0)
	const key, body = "pending-key-1", `{"sku":"tea"}`
	lease, _, err := s.db.Claim(context.Background(), serverScope(key), serverFingerprint(t, body))
	require.NoError(t, err)
	require.NoError(t, lease.MarkUnknown(context.Background()))

	store := &idemclient.MemoryKeyStore{}
	_, err = store.Save(context.Background(), "order-9", key)
	require.NoError(t, err)
	tr := newTransport(t, &idemclient.Options{Base: noReuse(), KeyStore: store})
	resp, err := tr.RoundTrip(post(t, idemclient.WithOperation(context.Background(), "order-9"), s.srv.URL+"/orders", body))
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.Equal(t, idem.CodeOutcomePending, idemclient.ProblemCode(resp))
	assert.Equal(t, 1, idemclient.Attempts(resp))
	_, done, err := store.Lookup(context.Background(), "order-9")
	require.NoError(t, err)
	assert.Equal(t, 0, done, "an unresolved outcome is not done")
}

// TestRestartWithPersistedKey: a client stores its key, sends, loses the
// response and stops. A new client (a new Transport over the same store;
// for the DB store a reopened DB) resumes the operation with the same key
// and gets the replay: one execution in all.
func TestRestartWithPersistedKey(t *testing.T) {
	for _, impl := range keyStoreImpls() {
		t.Run(impl.name, func(t *testing.T) {
			s := newIdemServer(t, 1)
			ctx := idemclient.WithOperation(context.Background(), "order-1042")
			const body = `{"sku":"tea","qty":2}`

			// First process: one attempt, committed on the server, lost.
			ks, restart := impl.open(t)
			store := ks.(lookupStore)
			tr := newTransport(t, &idemclient.Options{Base: noReuse(), KeyStore: store, MaxAttempts: 1})
			_, err := tr.RoundTrip(post(t, ctx, s.srv.URL+"/orders", body))
			var rerr *idemclient.RetryError
			require.ErrorAs(t, err, &rerr)
			key, done, err := store.Lookup(context.Background(), "order-1042")
			require.NoError(t, err)
			assert.Equal(t, rerr.Key, key)
			assert.Equal(t, 0, done, "a lost response is not definitive")
			assert.Equal(t, int32(1), s.executions.Load())

			// Second process: same operation name, same key, a replay.
			store = restart().(lookupStore)
			tr = newTransport(t, &idemclient.Options{Base: noReuse(), KeyStore: store})
			resp, err := tr.RoundTrip(post(t, ctx, s.srv.URL+"/orders", body))
			require.NoError(t, err)
			defer resp.Body.Close()
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.True(t, idemclient.Replayed(resp))
			assert.Equal(t, key, idemclient.Key(resp))
			assert.Equal(t, int32(1), s.executions.Load(), "exactly one execution across the restart")
			_, done, err = store.Lookup(context.Background(), "order-1042")
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, done)
		})
	}
}
