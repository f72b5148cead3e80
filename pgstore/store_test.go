package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// open opens a store on dsn and closes it when t ends. Its background
// loop is off unless opts asks for it, so that only the test sweeps.
func open(t *testing.T, dsn string, opts *pgstore.Options) *pgstore.Store {
	t.Helper()
	var o pgstore.Options
	if opts != nil {
		o = *opts
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = -1
	}
	s, err := pgstore.Open(t.Context(), dsn, &o)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// The suite runs with each order of a claim's statements to start with;
// its claims move the order as they go.
func TestConformance(t *testing.T) {
	for _, first := range []bool{true, false} {
		t.Run(claimOrder(first), func(t *testing.T) {
			idemtest.TestStore(t, idemtest.Limits{}, func(t *testing.T, now func() time.Time) idem.Store {
				s := open(t, pgtest.DSN(t), &pgstore.Options{Now: now})
				pgstore.SetInsertFirst(s, first)
				return s
			})
		})
	}
}

func claimOrder(insertFirst bool) string {
	if insertFirst {
		return "insert first"
	}
	return "read first"
}

// Claims insert first while most keys are new, and read first while most
// meet a record; the answers are the same either way.
func TestClaimOrderFollowsWorkload(t *testing.T) {
	s := open(t, pgtest.DSN(t), &pgstore.Options{Now: idemtest.NewClock().Now})
	require.True(t, pgstore.InsertFirst(s), "a new store expects new keys")
	l, _, err := s.Claim(t.Context(), scope("done"), fp)
	require.NoError(t, err)
	require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 201, Body: []byte("ok")}))
	for i := range 80 {
		_, rec, err := s.Claim(t.Context(), scope("done"), fp)
		require.NoError(t, err)
		require.NotNil(t, rec, "replay %d", i)
		assert.Equal(t, "ok", string(rec.Response.Body))
	}
	assert.False(t, pgstore.InsertFirst(s), "after replays only")
	for i := range 80 {
		l, _, err := s.Claim(t.Context(), scope(fmt.Sprint("new-", i)), fp)
		require.NoError(t, err)
		require.NotNil(t, l, "new key %d", i)
	}
	assert.True(t, pgstore.InsertFirst(s), "after new keys only")
}

func TestReplicasOneWinner(t *testing.T) {
	a, b := replicas(t, idemtest.NewClock(), nil)
	const claimers = 64
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners int
		start   = make(chan struct{})
	)
	for i := range claimers {
		store := a
		if i%2 == 1 {
			store = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			l, rec, err := store.Claim(t.Context(), scope("k"), fp)
			switch {
			case err == nil && l != nil:
				mu.Lock()
				winners++
				mu.Unlock()
			case err == nil:
				t.Errorf("a replay (%v) of a key nobody completed", rec)
			default:
				assert.ErrorIs(t, err, idem.ErrInProgress)
			}
		}()
	}
	close(start)
	wg.Wait()
	assert.Equal(t, 1, winners)
}

// The order is the order of the statements: a table locked against
// inserts holds up a replay that inserts first, and not one that reads
// first.
func TestClaimOrderIsTheStatements(t *testing.T) {
	dsn := pgtest.DSN(t)
	s := open(t, dsn, &pgstore.Options{Now: idemtest.NewClock().Now})
	done := scope("done")
	l, _, err := s.Claim(t.Context(), done, fp)
	require.NoError(t, err)
	require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 200}))

	conn, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	tx, err := conn.Begin(t.Context())
	require.NoError(t, err)
	defer tx.Rollback(context.Background())
	_, err = tx.Exec(t.Context(), "LOCK TABLE idempotency_keys IN SHARE MODE")
	require.NoError(t, err)

	pgstore.SetInsertFirst(s, false)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, rec, err := s.Claim(ctx, done, fp)
	require.NoError(t, err, "a plain read passes the lock")
	require.NotNil(t, rec)

	pgstore.SetInsertFirst(s, true)
	ctx, cancel = context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, _, err = s.Claim(ctx, done, fp)
	assert.Error(t, err, "the insert waits for the lock until the deadline")
}

// A claim of a live record only reads it: the replay and the refusal
// neither write the row nor lock it, so neither waits for a commit to
// reach the disk. A row lock would leave the claim's transaction id in
// the row's xmax.
func TestClaimOfLiveRecordWritesNothing(t *testing.T) {
	dsn := pgtest.DSN(t)
	s := open(t, dsn, &pgstore.Options{Now: idemtest.NewClock().Now})
	done, held := scope("done"), scope("held")
	l, _, err := s.Claim(t.Context(), done, fp)
	require.NoError(t, err)
	require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 200}))
	_, _, err = s.Claim(t.Context(), held, fp)
	require.NoError(t, err)

	conn, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	version := func(sc idem.Scope) (v string) {
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT ctid::text || '/' || xmin::text || '/' || xmax::text
			FROM idempotency_keys WHERE idem_key = $1`, sc.Key).Scan(&v))
		return v
	}
	before := []string{version(done), version(held)}
	for _, first := range []bool{true, false} {
		pgstore.SetInsertFirst(s, first)
		_, rec, err := s.Claim(t.Context(), done, fp)
		require.NoError(t, err)
		require.NotNil(t, rec)
		pgstore.SetInsertFirst(s, first)
		_, _, err = s.Claim(t.Context(), held, fp)
		require.ErrorIs(t, err, idem.ErrInProgress)
		assert.Equal(t, before, []string{version(done), version(held)}, claimOrder(first))
	}
}

func TestEventsAreLogged(t *testing.T) {
	var out syncBuffer
	s := open(t, pgtest.DSN(t), &pgstore.Options{Events: slog.New(slog.NewTextHandler(&out, nil))})
	l, _, err := s.Claim(t.Context(), scope("secret-key"), fp)
	require.NoError(t, err)
	require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 201}))
	_, rec, err := s.Claim(t.Context(), scope("secret-key"), fp)
	require.NoError(t, err)
	require.NotNil(t, rec)
	logged := out.String()
	for _, e := range []idem.Event{idem.EventClaimed, idem.EventCompleted, idem.EventReplayed} {
		assert.Contains(t, logged, "event="+e.String())
	}
	assert.Contains(t, logged, "key_hash="+idem.KeyHash("secret-key"))
	assert.NotContains(t, logged, "secret-key")
	m, err := s.Metrics(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(1), m.Events[idem.EventReplayed])
}

// quiet are options that keep the listener's reconnection warnings out of
// the test's output.
func quiet(o *pgstore.Options) *pgstore.Options {
	if o == nil {
		o = &pgstore.Options{}
	}
	o.Logger = slog.New(slog.DiscardHandler)
	return o
}

// counted is a handler behind the middleware that counts its runs.
type counted struct{ runs atomic.Int64 }

func (c *counted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.runs.Add(1)
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"pay_1"}`)
}

// middleware serves h behind idemhttp on s.
func middleware(t *testing.T, s idem.Store, h http.Handler) http.Handler {
	t.Helper()
	mw, err := idemhttp.New(idemhttp.Options{Store: s, Logger: slog.New(slog.DiscardHandler),
		Tenant: func(*http.Request) (string, error) { return "acme", nil }})
	require.NoError(t, err)
	return mw(h)
}

// post sends one keyed POST to h and returns the answer.
func post(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":100}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// assertStoreUnavailable checks that err is a store failure, not a
// refusal, and names no credential.
func assertStoreUnavailable(t *testing.T, err error, secrets ...string) {
	t.Helper()
	require.Error(t, err)
	var ke *idem.KeyError
	assert.False(t, errors.As(err, &ke), "a store failure reported as a refusal: %v", err)
	for _, s := range secrets {
		assert.NotContains(t, err.Error(), s)
	}
}

// TestOutageServerRestart stops the database under an open Store: every
// call fails promptly with an error that names no credential, requests get
// 503 without running their handler, nothing is written, and once the
// server is back the same Store serves claims and wakes waiters again.
func TestOutageServerRestart(t *testing.T) {
	const password = "hunter2-secret"
	dsn := strings.Replace(pgtest.DSN(t), "postgres@", "postgres:"+password+"@", 1) // trust: ignored
	s := open(t, dsn, quiet(nil))
	h := &counted{}
	srv := middleware(t, s, h)
	require.Equal(t, http.StatusCreated, post(srv, "before").Code)
	oldListener := pgstore.ListenerPID(s)

	pgtest.Stop(t)
	ctx, cancel := context.WithTimeout(t.Context(), wakeBound)
	defer cancel()
	l, rec, err := s.Claim(ctx, scope("down"), fp)
	assert.Nil(t, l)
	assert.Nil(t, rec)
	assertStoreUnavailable(t, err, password, "user=")
	t.Logf("a claim while the server is down: %v", err)
	require.NoError(t, ctx.Err(), "the claim took until its context ended")
	_, err = s.Get(ctx, scope("down"))
	assertStoreUnavailable(t, err, password)
	assertStoreUnavailable(t, s.Ping(ctx), password)
	w := post(srv, "during")
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Contains(t, w.Body.String(), idem.CodeStoreUnavailable)
	assert.Equal(t, int64(1), h.runs.Load(), "the handler ran while the store was down")

	pgtest.Start(t)
	for _, k := range []string{"down", "during"} {
		_, err := s.Get(t.Context(), idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: k})
		require.ErrorIs(t, err, idem.ErrNotFound, "a failed claim left a record")
	}
	w = post(srv, "during")
	assert.Equal(t, http.StatusCreated, w.Code, w.Body.String())
	assert.Equal(t, int64(2), h.runs.Load())
	assert.Equal(t, "true", post(srv, "during").Header().Get("Idempotent-Replayed"))

	// The listener reconnects and wakes waiters by notification again.
	require.Eventually(t, func() bool {
		p := pgstore.ListenerPID(s)
		return p != 0 && p != oldListener
	}, wakeBound, 10*time.Millisecond)
	l, _, err = s.Claim(t.Context(), scope("after"), fp)
	require.NoError(t, err)
	woke := waitOn(t, s, scope("after"))
	require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 200}))
	within(t, woke, wakeBound)
}

// terminate ends the other backends of conn's database that match where,
// as a server restart does from the client's side, waits for each to
// exit and returns how many it ended.
func terminate(t *testing.T, conn *pgx.Conn, where string) int {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND `+where).Scan(&n))
	return n
}

// TestOutageConnectionsTerminated: every connection of the store is cut,
// the listener's too. The next calls fail none: the pool turns away the
// connections the server closed and connects afresh.
func TestOutageConnectionsTerminated(t *testing.T) {
	dsn := pgtest.DSN(t)
	s := open(t, dsn, quiet(nil))
	look := connect(t, dsn)
	for i := range 4 {
		l, _, err := s.Claim(t.Context(), scope(fmt.Sprint("warm", i)), fp)
		require.NoError(t, err)
		require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 200}))
	}
	require.Positive(t, terminate(t, look, "application_name LIKE 'idem-pgstore%'"))

	for i := range 3 {
		l, _, err := s.Claim(t.Context(), scope(fmt.Sprint("k", i)), fp)
		require.NoError(t, err, "a claim after the connections were cut")
		require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 200}))
	}
}

// TestOutageClaimCutMidStatement: a claim whose connection is cut while
// its statement runs has an outcome the store cannot know. It is an error,
// so the middleware answers 503 and never runs the handler.
func TestOutageClaimCutMidStatement(t *testing.T) {
	e := newTxEnv(t, nil)
	tx := e.begin(t)
	_, _, err := e.a.ClaimTx(t.Context(), tx, idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "k"}, fp)
	require.NoError(t, err)

	h := &counted{}
	srv := middleware(t, e.b, h)
	answer := make(chan *httptest.ResponseRecorder, 1)
	go func() { answer <- post(srv, "k") }()
	// The request's claim now waits for tx; cut its connection.
	e.awaitLockWait(t)
	require.Equal(t, 1, terminate(t, e.look, "wait_event_type = 'Lock'"))
	var w *httptest.ResponseRecorder
	select {
	case w = <-answer:
	case <-time.After(wakeBound):
		t.Fatalf("no answer within %s", wakeBound)
	}
	assert.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
	assert.Contains(t, w.Body.String(), idem.CodeStoreUnavailable)
	assert.Zero(t, h.runs.Load())

	require.NoError(t, tx.Rollback(t.Context()))
	assert.Equal(t, http.StatusCreated, post(srv, "k").Code)
	assert.Equal(t, int64(1), h.runs.Load())
}
