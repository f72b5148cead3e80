package idem_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"testing"

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
	resp, replayed, err := idem.Do(ctx, db, scope("k1"), fp("a"), run(&runs, paid, nil))
	require.NoError(t, err)
	assert.False(t, replayed)
	assert.Equal(t, paid, resp)

	resp, replayed, err = idem.Do(ctx, db, scope("k1"), fp("a"), run(&runs, idem.Response{Status: 500}, nil))
	require.NoError(t, err)
	assert.True(t, replayed)
	assert.Equal(t, paid.Status, resp.Status)
	assert.Equal(t, paid.Body, resp.Body)
	assert.Equal(t, 1, runs, "a replay never runs the operation")

	_, _, err = idem.Do(ctx, db, scope("k1"), fp("b"), run(&runs, paid, nil))
	keyErr(t, err, idem.ErrFingerprintMismatch, idem.StateCompleted)
	assert.Equal(t, 1, runs)
}

func TestDoErrorsDecideTheOutcome(t *testing.T) {
	db := memStore(t)
	runs := 0
	noEffect := fmt.Errorf("card declined before capture: %w", idem.ErrNoEffect)
	_, _, err := idem.Do(ctx, db, scope("released"), fp("a"), run(&runs, idem.Response{}, noEffect))
	require.ErrorIs(t, err, idem.ErrNoEffect)
	_, err = db.Get(ctx, scope("released"))
	require.ErrorIs(t, err, idem.ErrNotFound, "an operation without effect frees its key")
	_, replayed, err := idem.Do(ctx, db, scope("released"), fp("a"), run(&runs, paid, nil))
	require.NoError(t, err)
	assert.False(t, replayed, "the retry ran the operation again")
	assert.Equal(t, 2, runs)

	timeout := errors.New("provider timed out")
	_, _, err = idem.Do(ctx, db, scope("unknown"), fp("a"), run(&runs, paid, timeout))
	require.ErrorIs(t, err, timeout)
	rec, err := db.Get(ctx, scope("unknown"))
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, rec.State)
	_, _, err = idem.Do(ctx, db, scope("unknown"), fp("a"), run(&runs, paid, nil))
	keyErr(t, err, idem.ErrOutcomePending, idem.StateUnknown)
	assert.Equal(t, 3, runs, "an unknown outcome is never run again")
}

func TestDoPanicAndGoexitRecordUnknown(t *testing.T) {
	db := memStore(t)
	assert.PanicsWithValue(t, "boom", func() {
		_, _, _ = idem.Do(ctx, db, scope("panic"), fp("a"), func(context.Context, idem.Lease) (idem.Response, error) {
			panic("boom")
		})
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _, _ = idem.Do(ctx, db, scope("goexit"), fp("a"), func(context.Context, idem.Lease) (idem.Response, error) {
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
	_, _, err := idem.Do(cctx, db, scope("k1"), fp("a"), func(context.Context, idem.Lease) (idem.Response, error) {
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
	resp, replayed, err := idem.Do(ctx, db, scope("k1"), fp("a"), run(new(int), idem.Response{Status: 42, Body: []byte("x")}, nil))
	require.ErrorIs(t, err, idem.ErrInvalidResponse)
	assert.False(t, replayed)
	assert.Zero(t, resp)
	rec, err := db.Get(ctx, scope("k1"))
	require.NoError(t, err)
	assert.Equal(t, idem.StateInProgress, rec.State, "the record waits for reconciliation")
}
