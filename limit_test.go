package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
)

// limitedMem is a MemStore on clock behind Limit(o).
func limitedMem(t *testing.T, clock *idemtest.Clock, o idem.Limits) (idem.Store, *idemtest.MemStore) {
	t.Helper()
	mem, err := idemtest.NewMemStore(&idemtest.MemOptions{Now: clock.Now})
	require.NoError(t, err)
	t.Cleanup(func() { mem.Close() })
	o.Now = clock.Now
	s, err := idem.Limit(mem, o)
	require.NoError(t, err)
	return s, mem
}

// limitErr asserts that err is a *LimitError wrapping want.
func limitErr(t *testing.T, err error, want error) *idem.LimitError {
	t.Helper()
	require.ErrorIs(t, err, want)
	var le *idem.LimitError
	require.ErrorAs(t, err, &le)
	assert.Positive(t, le.RetryAfter)
	return le
}

func TestLimitClaimRate(t *testing.T) {
	clock := idemtest.NewClock()
	s, mem := limitedMem(t, clock, idem.Limits{ClaimRate: 1, ClaimBurst: 3})

	l, _, err := s.Claim(ctx, scope("done"), fp("a"))
	require.NoError(t, err)
	require.NoError(t, l.Complete(ctx, paid))
	for range 5 {
		_, rec, err := s.Claim(ctx, scope("done"), fp("a"))
		require.NoError(t, err)
		require.NotNil(t, rec, "a replay")
	}
	_, _, err = s.Claim(ctx, scope("running"), fp("a"))
	require.NoError(t, err, "replays spend nothing of the burst")
	_, _, err = s.Claim(ctx, scope("third"), fp("a"))
	require.NoError(t, err)

	_, _, err = s.Claim(ctx, scope("fourth"), fp("a"))
	assert.Equal(t, time.Second, limitErr(t, err, idem.ErrRateLimited).RetryAfter)
	_, err = mem.Get(ctx, scope("fourth"))
	assert.ErrorIs(t, err, idem.ErrNotFound, "a refused key stores nothing")

	// Over the limit, every key that exists still gets its answer.
	_, rec, err := s.Claim(ctx, scope("done"), fp("a"))
	require.NoError(t, err)
	assert.Equal(t, paid.Body, rec.Response.Body)
	_, _, err = s.Claim(ctx, scope("running"), fp("a"))
	keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)
	_, _, err = s.Claim(ctx, scope("done"), fp("b"))
	keyErr(t, err, idem.ErrFingerprintMismatch, idem.StateCompleted)

	other := idem.Scope{Tenant: "globex", Endpoint: scope("").Endpoint, Key: "fourth"}
	_, _, err = s.Claim(ctx, other, fp("a"))
	assert.NoError(t, err, "another tenant is not slowed")

	clock.Advance(time.Second)
	_, _, err = s.Claim(ctx, scope("fourth"), fp("a"))
	require.NoError(t, err, "a second refills one key")
	_, _, err = s.Claim(ctx, scope("fifth"), fp("a"))
	limitErr(t, err, idem.ErrRateLimited)
}

func TestLimitPerEndpoint(t *testing.T) {
	at := func(endpoint, key string) idem.Scope {
		return idem.Scope{Tenant: "acme", Endpoint: endpoint, Key: key}
	}
	for _, per := range []bool{false, true} {
		s, _ := limitedMem(t, idemtest.NewClock(), idem.Limits{ClaimRate: 0.5, PerEndpoint: per})
		_, _, err := s.Claim(ctx, at("POST /a", "k1"), fp("a"))
		require.NoError(t, err)
		_, _, err = s.Claim(ctx, at("POST /a", "k2"), fp("a"))
		limitErr(t, err, idem.ErrRateLimited)
		_, _, err = s.Claim(ctx, at("POST /b", "k3"), fp("a"))
		if per {
			assert.NoError(t, err, "each endpoint has a bucket")
		} else {
			assert.ErrorIs(t, err, idem.ErrRateLimited, "one bucket per tenant")
		}
	}
}

func TestLimitStoreSize(t *testing.T) {
	clock := idemtest.NewClock()
	s, mem := limitedMem(t, clock, idem.Limits{MaxStoreBytes: 100})

	running, _, err := s.Claim(ctx, scope("running"), fp("a"))
	require.NoError(t, err)
	l, _, err := s.Claim(ctx, scope("big"), fp("a"))
	require.NoError(t, err)
	require.NoError(t, l.Complete(ctx, idem.Response{Status: 200, Body: make([]byte, 200)}))

	_, _, err = s.Claim(ctx, scope("new"), fp("a"))
	require.NoError(t, err, "the size is read once a second")
	clock.Advance(time.Second)
	_, _, err = s.Claim(ctx, scope("newer"), fp("a"))
	assert.Equal(t, idem.StoreFullRetry, limitErr(t, err, idem.ErrStoreFull).RetryAfter)
	_, err = mem.Get(ctx, scope("newer"))
	assert.ErrorIs(t, err, idem.ErrNotFound, "a refused key stores nothing")

	_, rec, err := s.Claim(ctx, scope("big"), fp("a"))
	require.NoError(t, err, "a full store still replays")
	assert.Len(t, rec.Response.Body, 200)
	assert.NoError(t, running.Complete(ctx, paid), "a claim in flight completes")

	clock.Advance(idem.DefaultTTL)
	_, err = mem.Sweep(ctx)
	require.NoError(t, err)
	_, _, err = s.Claim(ctx, scope("after"), fp("a"))
	assert.NoError(t, err, "a sweep makes room again")
}

// lowDisk is a store whose disk has free bytes left.
type lowDisk struct {
	idem.Store
	free int64
}

func (d *lowDisk) Size(context.Context) (idem.StoreSize, error) {
	return idem.StoreSize{Bytes: 1, FreeBytes: d.free}, nil
}

func TestLimitFreeDisk(t *testing.T) {
	mem, err := idemtest.NewMemStore(nil)
	require.NoError(t, err)
	defer mem.Close()
	clock := idemtest.NewClock()
	disk := &lowDisk{Store: mem, free: 1 << 20}
	s, err := idem.Limit(disk, idem.Limits{MinFreeBytes: 1 << 20, Now: clock.Now})
	require.NoError(t, err)
	_, _, err = s.Claim(ctx, scope("k1"), fp("a"))
	require.NoError(t, err)
	disk.free = 1<<20 - 1
	clock.Advance(time.Second)
	_, _, err = s.Claim(ctx, scope("k2"), fp("a"))
	limitErr(t, err, idem.ErrStoreFull)
	_, _, err = s.Claim(ctx, scope("k1"), fp("a"))
	keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)
}

func TestLimitOptions(t *testing.T) {
	mem, err := idemtest.NewMemStore(nil)
	require.NoError(t, err)
	defer mem.Close()
	for _, o := range []idem.Limits{{ClaimRate: -1}, {ClaimBurst: -1}, {Tenants: -1}, {MaxStoreBytes: -1}, {SizeEvery: -time.Second}} {
		_, err = idem.Limit(mem, o)
		assert.ErrorIs(t, err, idem.ErrInvalidOptions, "%+v", o)
	}
	_, err = idem.Limit(struct{ idem.Store }{mem}, idem.Limits{MaxStoreBytes: 1})
	assert.ErrorIs(t, err, idem.ErrInvalidOptions, "a size bound needs a Sizer")
}

func TestRefuseLimits(t *testing.T) {
	rf := idem.Refuse(&idem.LimitError{Err: idem.ErrRateLimited, RetryAfter: 3 * time.Second}, "request")
	assert.Equal(t, idem.CodeRateLimited, rf.Code)
	assert.Equal(t, 3*time.Second, rf.RetryAfter)
	rf = idem.Refuse(&idem.LimitError{Err: idem.ErrStoreFull, RetryAfter: idem.StoreFullRetry}, "request")
	assert.Equal(t, idem.CodeStoreFull, rf.Code)
	assert.Equal(t, idem.StoreFullRetry, rf.RetryAfter)
}
