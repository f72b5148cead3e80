package idem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
)

var ctx = context.Background()

func fp(s string) idem.Fingerprint { return sha256.Sum256([]byte(s)) }

func scope(key string) idem.Scope {
	return idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: key}
}

var paid = idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1"}`)}

// keyErr asserts that err is a *KeyError wrapping want in state st.
func keyErr(t *testing.T, err error, want error, st idem.State) {
	t.Helper()
	require.ErrorIs(t, err, want)
	var ke *idem.KeyError
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, st, ke.State)
}

// run returns an operation for idem.Do that counts its runs and answers
// with resp and err.
func run(runs *int, resp idem.Response, err error) func(context.Context, idem.Lease) (idem.Response, error) {
	return func(context.Context, idem.Lease) (idem.Response, error) {
		*runs++
		return resp, err
	}
}

func memStore(t *testing.T) *idemtest.MemStore {
	t.Helper()
	db, err := idemtest.NewMemStore(nil)
	require.NoError(t, err)
	return db
}

func TestDoRunsOnceAndReplays(t *testing.T) {
	db := memStore(t)
	runs := 0
	res, err := idem.Do(ctx, db, scope("k1"), fp("a"), nil, run(&runs, paid, nil))
	require.NoError(t, err)
	assert.Nil(t, res.Replayed)
	assert.Equal(t, paid, res.Response)

	res, err = idem.Do(ctx, db, scope("k1"), fp("a"), nil, run(&runs, idem.Response{Status: 500}, nil))
	require.NoError(t, err)
	require.NotNil(t, res.Replayed)
	assert.Equal(t, idem.StateCompleted, res.Replayed.State)
	assert.Equal(t, paid.Status, res.Response.Status)
	assert.Equal(t, paid.Body, res.Response.Body)
	assert.Equal(t, 1, runs, "a replay never runs the operation")

	_, err = idem.Do(ctx, db, scope("k1"), fp("b"), nil, run(&runs, paid, nil))
	keyErr(t, err, idem.ErrFingerprintMismatch, idem.StateCompleted)
	assert.Equal(t, 1, runs)
}

func TestDoErrorsDecideTheOutcome(t *testing.T) {
	db := memStore(t)
	runs := 0
	noEffect := fmt.Errorf("card declined before capture: %w", idem.ErrNoEffect)
	_, err := idem.Do(ctx, db, scope("released"), fp("a"), nil, run(&runs, idem.Response{}, noEffect))
	require.ErrorIs(t, err, idem.ErrNoEffect)
	_, err = db.Get(ctx, scope("released"))
	require.ErrorIs(t, err, idem.ErrNotFound, "an operation without effect frees its key")
	res, err := idem.Do(ctx, db, scope("released"), fp("a"), nil, run(&runs, paid, nil))
	require.NoError(t, err)
	assert.Nil(t, res.Replayed, "the retry ran the operation again")
	assert.Equal(t, 2, runs)

	timeout := errors.New("provider timed out")
	_, err = idem.Do(ctx, db, scope("unknown"), fp("a"), nil, run(&runs, paid, timeout))
	require.ErrorIs(t, err, timeout)
	rec, err := db.Get(ctx, scope("unknown"))
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, rec.State)
	_, err = idem.Do(ctx, db, scope("unknown"), fp("a"), nil, run(&runs, paid, nil))
	keyErr(t, err, idem.ErrOutcomePending, idem.StateUnknown)
	assert.Equal(t, 3, runs, "an unknown outcome is never run again")
}

func TestDoPanicAndGoexitRecordUnknown(t *testing.T) {
	db := memStore(t)
	assert.PanicsWithValue(t, "boom", func() {
		_, _ = idem.Do(ctx, db, scope("panic"), fp("a"), nil, func(context.Context, idem.Lease) (idem.Response, error) {
			panic("boom")
		})
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = idem.Do(ctx, db, scope("goexit"), fp("a"), nil, func(context.Context, idem.Lease) (idem.Response, error) {
			runtime.Goexit()
			return idem.Response{}, nil
		})
	}()
	<-done
	for _, k := range []string{"panic", "goexit"} {
		rec, err := db.Get(ctx, scope(k))
		require.NoError(t, err)
		assert.Equal(t, idem.StateUnknown, rec.State, k)
	}
}

// TestDoRecordsOutcomeAfterCancel: a caller that gives up while the
// operation runs must not leave the record in progress.
func TestDoRecordsOutcomeAfterCancel(t *testing.T) {
	db := memStore(t)
	cctx, cancel := context.WithCancel(ctx)
	_, err := idem.Do(cctx, db, scope("k1"), fp("a"), nil, func(context.Context, idem.Lease) (idem.Response, error) {
		cancel()
		return paid, nil
	})
	require.NoError(t, err)
	rec, err := db.Get(ctx, scope("k1"))
	require.NoError(t, err)
	assert.Equal(t, idem.StateCompleted, rec.State)
}

// TestDoKeepsAnUnstoredResponse: when the outcome cannot be stored, Do
// hands out the error, never the response a retry could not get back.
func TestDoKeepsAnUnstoredResponse(t *testing.T) {
	db := memStore(t)
	res, err := idem.Do(ctx, db, scope("k1"), fp("a"), nil, run(new(int), idem.Response{Status: 42, Body: []byte("x")}, nil))
	require.ErrorIs(t, err, idem.ErrOutcomeNotStored)
	assert.ErrorIs(t, err, idem.ErrInvalidResponse, "the store's reason is kept")
	assert.Zero(t, res)
	rec, err := db.Get(ctx, scope("k1"))
	require.NoError(t, err)
	assert.Equal(t, idem.StateInProgress, rec.State, "the record waits for reconciliation")
}

// waitSignal is a store whose Wait says when it is called, so that a test
// can finish the first attempt while a second one waits for it.
type waitSignal struct {
	idem.Store
	waiting chan struct{}
}

func (w *waitSignal) Wait(ctx context.Context, s idem.Scope) error {
	close(w.waiting)
	return w.Store.Wait(ctx, s)
}

func TestDoWaitsForTheFirstAttempt(t *testing.T) {
	db := memStore(t)
	first, _, err := db.Claim(ctx, scope("k1"), fp("a"))
	require.NoError(t, err)

	_, err = idem.Do(ctx, db, scope("k1"), fp("a"), nil, run(new(int), paid, nil))
	keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)

	store := &waitSignal{Store: db, waiting: make(chan struct{})}
	got := make(chan error, 1)
	var res idem.Result
	runs := 0
	go func() {
		var err error
		res, err = idem.Do(ctx, store, scope("k1"), fp("a"), &idem.DoOptions{Wait: time.Minute}, run(&runs, idem.Response{Status: 500}, nil))
		got <- err
	}()
	<-store.waiting
	require.NoError(t, first.Complete(ctx, paid))
	require.NoError(t, <-got)
	require.NotNil(t, res.Replayed, "the waiting attempt replays what the first one stored")
	assert.Equal(t, paid.Body, res.Response.Body)
	assert.Zero(t, runs)
}

func TestDoWaitEndsInARefusal(t *testing.T) {
	db := memStore(t)
	_, _, err := db.Claim(ctx, scope("k1"), fp("a"))
	require.NoError(t, err)
	_, err = idem.Do(ctx, db, scope("k1"), fp("a"), &idem.DoOptions{Wait: time.Millisecond}, run(new(int), paid, nil))
	keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)

	_, err = idem.Do(ctx, db, scope("k2"), fp("a"), &idem.DoOptions{Wait: -time.Second}, run(new(int), paid, nil))
	assert.ErrorIs(t, err, idem.ErrInvalidOptions)
	_, err = db.Get(ctx, scope("k2"))
	assert.ErrorIs(t, err, idem.ErrNotFound, "invalid options claim nothing")
}

// broken is a store that fails every claim as an unreachable server would.
type broken struct{ idem.Store }

var errDown = errors.New("dial tcp 10.0.0.7:5432: connection refused")

func (broken) Claim(context.Context, idem.Scope, idem.Fingerprint) (idem.Lease, *idem.Record, error) {
	return nil, nil, errDown
}

// TestDoLogsStoreFailures: the store's own failures are logged once, by
// Do, whichever front end called it; the contract's refusals are not.
func TestDoLogsStoreFailures(t *testing.T) {
	var logs bytes.Buffer
	opts := &idem.DoOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	_, err := idem.Do(ctx, broken{memStore(t)}, scope("k1"), fp("a"), opts, run(new(int), paid, nil))
	require.ErrorIs(t, err, errDown)
	assert.Contains(t, logs.String(), "idem: claim failed")
	assert.Equal(t, idem.CodeStoreUnavailable, idem.Refuse(err, "request").Code)

	logs.Reset()
	db := memStore(t)
	_, err = idem.Do(ctx, db, scope("k1"), fp("a"), opts, run(new(int), idem.Response{Status: 42}, nil))
	require.ErrorIs(t, err, idem.ErrOutcomeNotStored)
	assert.Contains(t, logs.String(), "storing the outcome failed")
	assert.NotContains(t, logs.String(), "key=k1", "the key is logged as a hash")

	logs.Reset()
	_, err = idem.Do(ctx, db, scope("k1"), fp("b"), opts, run(new(int), paid, nil))
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	assert.Empty(t, logs.String())
}
