package idemgrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemgrpc"
	"github.com/idemkv/idem/internal/idemtest"
)

// TestClockBehindIsUnavailable steps the store's clock back past its
// tolerance: the call is refused with Unavailable clock_behind and a
// retry delay, the handler does not run and nothing is stored; once the
// clock is right it runs.
func TestClockBehindIsUnavailable(t *testing.T) {
	db, clock := idemtest.Open(t, nil)
	e := setup(t, idemgrpc.Options{Store: db})
	_, _, err := e.call(t, payMethod, "acme", payment(t, 42), "first")
	require.NoError(t, err)

	clock.Advance(-time.Minute)
	_, _, err = e.call(t, payMethod, "acme", payment(t, 42), "k")
	st := refused(t, err, codes.Unavailable, idem.CodeClockBehind)
	if ri := retryInfo(st); assert.NotNil(t, ri) {
		assert.Equal(t, idem.ClockBehindRetry, ri.GetRetryDelay().AsDuration())
	}
	assert.Equal(t, int64(1), e.runs.Load(), "nothing ran")
	_, err = db.Get(context.Background(), idem.Scope{Tenant: "acme", Endpoint: payMethod, Key: "k"})
	require.ErrorIs(t, err, idem.ErrNotFound, "nothing was stored")

	clock.Advance(time.Minute)
	_, _, err = e.call(t, payMethod, "acme", payment(t, 42), "k")
	require.NoError(t, err)
	assert.Equal(t, int64(2), e.runs.Load())
}
