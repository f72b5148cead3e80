package idemtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
)

// TestStore is the conformance suite of idem.Store: a backend passes it
// to show that it keeps the contract. Each property is a subtest, so a
// failure names what broke, and each subtest opens a store of its own.
//
// The suite owns the time: open gets the Now of a Clock the suite advances,
// and the store must read time through it alone. open must return an
// empty store that is closed when t ends (t.Cleanup); closing it again
// after the suite closed it must be harmless. The suite assumes of the
// store it gets:
//
//   - the lease and the TTL are whatever the store grants: the suite reads
//     them from a claim's record (LeaseUntil-CreatedAt and
//     ExpiresAt-CreatedAt), and assumes the TTL is at least two leases;
//   - bodies up to limits.MaxBodyBytes are kept, and larger ones omitted
//     (BodyOmitted, with BodyLen and BodyDigest).
//
// When the store is also a idem.Operator, the suite checks the
// operator's calls too (take-over, overdue listings, reconciliation,
// listings, sweeps, metrics); otherwise it leaves them out.
//
// Nothing sleeps to make a property hold. Where the suite must see that
// Wait blocks, it looks for a premature return for a few milliseconds,
// and bounds every wait for a wake-up by a generous timeout that only a
// broken store reaches.
func TestStore(t *testing.T, limits Limits, open func(t *testing.T, now func() time.Time) idem.Store) {
	if limits.MaxBodyBytes == 0 {
		limits.MaxBodyBytes = idem.DefaultMaxBodyBytes
	}
	// One store, opened up front, tells whether the backend is an Operator.
	_, isOp := open(t, NewClock().Now).(idem.Operator)
	su := &suite{open: open, operator: isOp, limits: limits}
	t.Run("claim", su.testClaim)
	t.Run("lease", su.testLease)
	t.Run("concurrent claims", su.testConcurrentClaims)
	t.Run("scopes", su.testScopes)
	t.Run("expiry", su.testExpiry)
	t.Run("bodies", su.testBodies)
	t.Run("wait", su.testWait)
	t.Run("invalid input", su.testInvalidInput)
	t.Run("context", su.testContext)
	t.Run("closed", su.testClosed)
	if isOp {
		t.Run("operator", su.testOperator)
	}
	if _, ok := open(t, NewClock().Now).(idem.Sizer); ok {
		t.Run("size", su.testSize)
	}
}

// testSize checks a Sizer's figures and that idem.Limit's size guard, on
// them, refuses new keys while everything else goes on.
func (su *suite) testSize(t *testing.T) {
	e := su.env(t)
	e.complete(scope("stored"), fingerprint("a"), idem.Response{Status: 201, Body: bytes.Repeat([]byte("x"), 4096)})
	running := e.claim(scope("running"), fingerprint("a"))
	sz, err := e.store.(idem.Sizer).Size(t.Context())
	require.NoError(t, err)
	assert.Positive(t, sz.Bytes, "a store with records takes room")
	assert.GreaterOrEqual(t, sz.FreeBytes, int64(-1))

	full, err := idem.Limit(e.store, idem.Limits{MaxStoreBytes: sz.Bytes - 1, Now: e.clock.Now})
	require.NoError(t, err)
	_, _, err = full.Claim(t.Context(), scope("new"), fingerprint("a"))
	require.ErrorIs(t, err, idem.ErrStoreFull)
	e.absent(scope("new"))
	_, rec, err := full.Claim(t.Context(), scope("stored"), fingerprint("a"))
	require.NoError(t, err, "a full store replays")
	assert.Len(t, rec.Response.Body, 4096)
	_, _, err = full.Claim(t.Context(), scope("running"), fingerprint("a"))
	keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)
	assert.NoError(t, running.Complete(t.Context(), idem.Response{Status: 200}), "a claim in flight completes")
}

// Bounds on the suite's waits. blockCheck is how long it watches for a
// Wait that returns too early; wakeBound is how long a wake-up may take
// before the store counts as never waking the waiter.
const (
	blockCheck = 20 * time.Millisecond
	wakeBound  = 10 * time.Second
)

// Limits are the bounds of the store under test that the suite checks,
// as the store's options set them.
type Limits struct {
	// MaxBodyBytes is the largest response body the store keeps for
	// replays. 0 means idem.DefaultMaxBodyBytes, every store's default.
	MaxBodyBytes int64
}

type suite struct {
	open     func(t *testing.T, now func() time.Time) idem.Store
	operator bool
	limits   Limits
}

// env is one subtest's store and clock.
type env struct {
	t     *testing.T
	clock *Clock
	store idem.Store
	op    idem.Operator // the store, or nil if it is not an Operator
}

func (su *suite) env(t *testing.T) *env {
	t.Helper()
	clock := NewClock()
	store := su.open(t, clock.Now)
	require.NotNil(t, store)
	op, _ := store.(idem.Operator)
	return &env{t: t, clock: clock, store: store, op: op}
}

// claim claims s with fp and requires the claim to win.
func (e *env) claim(s idem.Scope, fp idem.Fingerprint) idem.Lease {
	e.t.Helper()
	l, rec, err := e.store.Claim(e.t.Context(), s, fp)
	require.NoError(e.t, err, "claim of %q", s.Key)
	require.Nil(e.t, rec)
	require.NotNil(e.t, l)
	return l
}

// complete claims s with fp and completes it with resp.
func (e *env) complete(s idem.Scope, fp idem.Fingerprint, resp idem.Response) idem.Lease {
	e.t.Helper()
	l := e.claim(s, fp)
	require.NoError(e.t, l.Complete(e.t.Context(), resp))
	return l
}

// get requires a live record for s.
func (e *env) get(s idem.Scope) *idem.Record {
	e.t.Helper()
	rec, err := e.store.Get(e.t.Context(), s)
	require.NoError(e.t, err, "get %q", s.Key)
	require.NotNil(e.t, rec)
	return rec
}

// absent requires that s has no live record.
func (e *env) absent(s idem.Scope) {
	e.t.Helper()
	_, err := e.store.Get(e.t.Context(), s)
	require.ErrorIs(e.t, err, idem.ErrNotFound, "get %q", s.Key)
}

// replay claims s with fp and requires the stored record back.
func (e *env) replay(s idem.Scope, fp idem.Fingerprint) *idem.Record {
	e.t.Helper()
	l, rec, err := e.store.Claim(e.t.Context(), s, fp)
	require.NoError(e.t, err, "replay of %q", s.Key)
	require.Nil(e.t, l)
	require.NotNil(e.t, rec)
	return rec
}

// unchanged runs fn and asserts that the record of s reads the same after
// it as before.
func (e *env) unchanged(s idem.Scope, what string, fn func()) {
	e.t.Helper()
	before, beforeErr := e.store.Get(e.t.Context(), s)
	fn()
	after, afterErr := e.store.Get(e.t.Context(), s)
	assert.Equal(e.t, beforeErr, afterErr, "%s changed what Get returns", what)
	assert.Equal(e.t, before, after, "%s changed the record", what)
}

// leaseOf and ttlOf read the store's lease and TTL off a record it granted.
func leaseOf(rec idem.Record) time.Duration { return rec.LeaseUntil.Sub(rec.CreatedAt) }
func ttlOf(rec idem.Record) time.Duration   { return rec.ExpiresAt.Sub(rec.CreatedAt) }

func fingerprint(name string) idem.Fingerprint { return sha256.Sum256([]byte(name)) }

func scope(key string) idem.Scope {
	return idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: key}
}

// paid is the response most properties store.
var paid = idem.Response{
	Status: 201,
	Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}},
	Body:   []byte(`{"id":"pay_1","status":"succeeded"}`),
}

// other is a response that differs from paid in every part.
var other = idem.Response{Status: 500, Header: http.Header{"X-Other": {"1"}}, Body: []byte("other")}

// assertResponse asserts that rec holds resp in full.
func assertResponse(t *testing.T, resp idem.Response, rec *idem.Record) {
	t.Helper()
	assert.Equal(t, idem.StateCompleted, rec.State)
	assert.Equal(t, resp.Status, rec.Response.Status)
	if len(resp.Header) == 0 {
		assert.Empty(t, rec.Response.Header)
	} else {
		assert.Equal(t, resp.Header, rec.Response.Header)
	}
	if len(resp.Body) == 0 {
		assert.Empty(t, rec.Response.Body)
	} else {
		assert.Equal(t, resp.Body, rec.Response.Body)
	}
	assert.False(t, rec.BodyOmitted)
	assert.Equal(t, int64(len(resp.Body)), rec.BodyLen)
	assert.Equal(t, sha256.Sum256(resp.Body), rec.BodyDigest)
}

// keyErr requires err to be a *KeyError wrapping want for a record in
// state st.
func keyErr(t *testing.T, err, want error, st idem.State) *idem.KeyError {
	t.Helper()
	require.ErrorIs(t, err, want)
	var ke *idem.KeyError
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, st, ke.State)
	return ke
}

// leaseEnds are the calls that end a lease, and Extend, which does not.
var leaseEnds = []struct {
	name  string
	call  func(ctx context.Context, l idem.Lease) error
	state idem.State // the record's state after the call; zero for none
}{
	{"complete", func(ctx context.Context, l idem.Lease) error { return l.Complete(ctx, paid) }, idem.StateCompleted},
	{"release", func(ctx context.Context, l idem.Lease) error { return l.Release(ctx) }, 0},
	{"unknown", func(ctx context.Context, l idem.Lease) error { return l.MarkUnknown(ctx) }, idem.StateUnknown},
	{"failed", func(ctx context.Context, l idem.Lease) error { return l.MarkFailed(ctx) }, idem.StateFailed},
	{"extend", func(ctx context.Context, l idem.Lease) error { return l.Extend(ctx) }, idem.StateInProgress},
}

// testClaim walks every state a record can be in and checks what a claim
// of it gets, and that a refused claim changes nothing.
func (su *suite) testClaim(t *testing.T) {
	s, a, b := scope("k1"), fingerprint("a"), fingerprint("b")
	tests := []struct {
		name  string
		setup func(e *env)
		fp    idem.Fingerprint
		check func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error)
	}{
		{
			name:  "fresh key is won",
			setup: func(e *env) {},
			fp:    a,
			check: func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error) {
				require.NoError(t, err)
				require.NotNil(t, l)
				assert.Equal(t, s, l.Scope())
				lr := l.Record()
				assert.Equal(t, s, lr.Scope)
				assert.Equal(t, idem.StateInProgress, lr.State)
				assert.Equal(t, a, lr.Fingerprint)
				assert.Equal(t, uint32(1), lr.Attempts)
				assert.WithinDuration(t, e.clock.Now(), lr.CreatedAt, time.Millisecond)
				assert.Positive(t, leaseOf(lr), "the lease ends after the claim")
				assert.GreaterOrEqual(t, ttlOf(lr), 2*leaseOf(lr), "the suite assumes a TTL of two leases at least")
				stored := e.get(s)
				assert.Equal(t, idem.StateInProgress, stored.State)
				assert.Equal(t, a, stored.Fingerprint)
				assert.Equal(t, s, stored.Scope)
			},
		},
		{
			name:  "completed replays",
			setup: func(e *env) { e.complete(s, a, paid) },
			fp:    a,
			check: func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error) {
				require.NoError(t, err)
				require.NotNil(t, rec)
				assertResponse(t, paid, rec)
				assert.Equal(t, a, rec.Fingerprint)
				assert.Equal(t, s, rec.Scope)
			},
		},
		{
			name:  "completed refuses another fingerprint",
			setup: func(e *env) { e.complete(s, a, paid) },
			fp:    b,
			check: func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error) {
				ke := keyErr(t, err, idem.ErrFingerprintMismatch, idem.StateCompleted)
				assert.Zero(t, ke.RetryAfter, "a mismatch is permanent")
			},
		},
		{
			name: "in progress asks to retry within the lease",
			setup: func(e *env) {
				l := e.claim(s, a)
				e.clock.Advance(leaseOf(l.Record()) * 9 / 10)
			},
			fp: a,
			check: func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error) {
				ke := keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)
				rest := e.get(s).LeaseUntil.Sub(e.clock.Now())
				assert.Positive(t, ke.RetryAfter)
				assert.LessOrEqual(t, ke.RetryAfter, rest, "the hint never points past the lease's end")
			},
		},
		{
			name:  "in progress refuses another fingerprint",
			setup: func(e *env) { e.claim(s, a) },
			fp:    b,
			check: func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error) {
				keyErr(t, err, idem.ErrFingerprintMismatch, idem.StateInProgress)
			},
		},
		{
			name:  "unknown refuses another fingerprint",
			setup: func(e *env) { require.NoError(e.t, e.claim(s, a).MarkUnknown(e.t.Context())) },
			fp:    b,
			check: func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error) {
				keyErr(t, err, idem.ErrFingerprintMismatch, idem.StateUnknown)
			},
		},
		{
			name: "extended lease is still in progress",
			setup: func(e *env) {
				l := e.claim(s, a)
				step := leaseOf(l.Record()) * 3 / 4
				e.clock.Advance(step)
				require.NoError(e.t, l.Extend(e.t.Context()))
				e.clock.Advance(step)
			},
			fp: a,
			check: func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error) {
				keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)
			},
		},
		{
			name: "overdue claim is pending, not run again",
			setup: func(e *env) {
				l := e.claim(s, a)
				e.clock.Advance(leaseOf(l.Record()))
			},
			fp: a,
			check: func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error) {
				keyErr(t, err, idem.ErrOutcomePending, idem.StateInProgress)
			},
		},
		{
			name:  "unknown is pending",
			setup: func(e *env) { require.NoError(e.t, e.claim(s, a).MarkUnknown(e.t.Context())) },
			fp:    a,
			check: func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error) {
				keyErr(t, err, idem.ErrOutcomePending, idem.StateUnknown)
			},
		},
		{
			name:  "failed is pending",
			setup: func(e *env) { require.NoError(e.t, e.claim(s, a).MarkFailed(e.t.Context())) },
			fp:    a,
			check: func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error) {
				keyErr(t, err, idem.ErrOutcomePending, idem.StateFailed)
			},
		},
		{
			name:  "released key is free, even for another request",
			setup: func(e *env) { require.NoError(e.t, e.claim(s, a).Release(e.t.Context())) },
			fp:    b,
			check: func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error) {
				require.NoError(t, err)
				require.NotNil(t, l)
				assert.Equal(t, b, l.Record().Fingerprint)
			},
		},
		{
			name: "expired completed key is free",
			setup: func(e *env) {
				l := e.complete(s, a, paid)
				e.clock.Advance(ttlOf(l.Record()))
			},
			fp: b,
			check: func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error) {
				require.NoError(t, err)
				require.NotNil(t, l)
				assert.Equal(t, b, l.Record().Fingerprint)
			},
		},
		{
			name: "expired unknown key is free",
			setup: func(e *env) {
				l := e.claim(s, a)
				require.NoError(e.t, l.MarkUnknown(e.t.Context()))
				e.clock.Advance(ttlOf(l.Record()))
			},
			fp: a,
			check: func(t *testing.T, e *env, l idem.Lease, rec *idem.Record, err error) {
				require.NoError(t, err)
				require.NotNil(t, l)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := su.env(t)
			tt.setup(e)
			before, beforeErr := e.store.Get(t.Context(), s)
			l, rec, err := e.store.Claim(t.Context(), s, tt.fp)
			if err != nil {
				assert.Nil(t, l, "a refused claim has no lease")
				assert.Nil(t, rec, "a refused claim has no record")
				after, afterErr := e.store.Get(t.Context(), s)
				assert.Equal(t, beforeErr, afterErr, "a refused claim changed what Get returns")
				assert.Equal(t, before, after, "a refused claim changed the record")
			} else {
				assert.True(t, (l == nil) != (rec == nil), "a claim returns a lease or a record, not both")
			}
			tt.check(t, e, l, rec, err)
		})
	}
}

// testLease checks what each lease call does after each way a lease ends,
// and every way a holder loses its lease.
func (su *suite) testLease(t *testing.T) {
	s, a, b := scope("k1"), fingerprint("a"), fingerprint("b")
	for _, first := range leaseEnds {
		for _, second := range leaseEnds {
			t.Run(first.name+"/then/"+second.name, func(t *testing.T) {
				e := su.env(t)
				l := e.claim(s, a)
				require.NoError(t, first.call(t.Context(), l))
				if first.state == 0 {
					e.absent(s)
					assert.Zero(t, l.Record().State, "a released lease's record has no state")
				} else {
					assert.Equal(t, first.state, e.get(s).State)
					assert.Equal(t, first.state, l.Record().State)
				}
				if first.state == idem.StateInProgress {
					require.NoError(t, second.call(t.Context(), l), "an extended lease is still held")
					return
				}
				e.unchanged(s, "a call on an ended lease", func() {
					assert.ErrorIs(t, second.call(t.Context(), l), idem.ErrLeaseLost)
				})
			})
		}
	}

	t.Run("extend moves the end of the lease", func(t *testing.T) {
		e := su.env(t)
		l := e.claim(s, a)
		lease := leaseOf(l.Record())
		e.clock.Advance(lease / 2)
		require.NoError(t, l.Extend(t.Context()))
		assert.WithinDuration(t, e.clock.Now().Add(lease), l.Record().LeaseUntil, time.Millisecond)
		assert.Equal(t, l.Record().LeaseUntil, e.get(s).LeaseUntil)
	})

	t.Run("lost after release and a new claim", func(t *testing.T) {
		e := su.env(t)
		old := e.claim(s, a)
		require.NoError(t, old.Release(t.Context()))
		newer := e.claim(s, b)
		e.unchanged(s, "a released holder", func() {
			assert.ErrorIs(t, old.Complete(t.Context(), other), idem.ErrLeaseLost, "a released holder must not write the new claim's outcome")
			assert.ErrorIs(t, old.Release(t.Context()), idem.ErrLeaseLost)
		})
		require.NoError(t, newer.Complete(t.Context(), paid))
		assertResponse(t, paid, e.replay(s, b))
	})

	t.Run("lost after expiry", func(t *testing.T) {
		e := su.env(t)
		l := e.claim(s, a)
		e.clock.Advance(ttlOf(l.Record()))
		for _, end := range leaseEnds {
			assert.ErrorIs(t, end.call(t.Context(), l), idem.ErrLeaseLost, end.name)
		}
		e.absent(s)
	})

	t.Run("lost after expiry and a new claim", func(t *testing.T) {
		e := su.env(t)
		old := e.claim(s, a)
		e.clock.Advance(ttlOf(old.Record()))
		newer := e.claim(s, b)
		e.unchanged(s, "an expired holder", func() {
			for _, end := range leaseEnds {
				assert.ErrorIs(t, end.call(t.Context(), old), idem.ErrLeaseLost, end.name)
			}
		})
		require.NoError(t, newer.Complete(t.Context(), paid))
		rec := e.replay(s, b)
		assertResponse(t, paid, rec)
		assert.Equal(t, b, rec.Fingerprint)
	})

	if su.operator {
		t.Run("lost after take-over", func(t *testing.T) {
			e := su.env(t)
			old := e.claim(s, a)
			e.clock.Advance(leaseOf(old.Record()))
			newer, err := e.op.TakeOver(t.Context(), s)
			require.NoError(t, err)
			e.unchanged(s, "a holder that was taken over", func() {
				for _, end := range leaseEnds {
					assert.ErrorIs(t, end.call(t.Context(), old), idem.ErrLeaseLost, end.name)
				}
			})
			require.NoError(t, newer.Complete(t.Context(), paid))
			assertResponse(t, paid, e.replay(s, a))
		})
	}

	t.Run("a late holder still records its outcome", func(t *testing.T) {
		// Past its lease a claim is only pending: until someone takes it
		// over or it expires, the holder's answer is the best there is.
		e := su.env(t)
		l := e.claim(s, a)
		e.clock.Advance(leaseOf(l.Record()))
		require.NoError(t, l.Complete(t.Context(), paid))
		assertResponse(t, paid, e.replay(s, a))
	})

	t.Run("completed responses are never overwritten", func(t *testing.T) {
		e := su.env(t)
		l := e.complete(s, a, paid)
		e.unchanged(s, "a call after completion", func() {
			for _, end := range leaseEnds {
				assert.ErrorIs(t, end.call(t.Context(), l), idem.ErrLeaseLost, end.name)
			}
			assert.ErrorIs(t, l.Complete(t.Context(), other), idem.ErrLeaseLost)
			if e.op != nil {
				_, err := e.op.TakeOver(t.Context(), s)
				assert.ErrorIs(t, err, idem.ErrCompleted)
			}
			_, _, err := e.store.Claim(t.Context(), s, fingerprint("b"))
			assert.ErrorIs(t, err, idem.ErrFingerprintMismatch)
		})
		rec := e.replay(s, a)
		assertResponse(t, paid, rec)
		assert.Equal(t, a, rec.Fingerprint)
	})

	t.Run("records are copies the caller owns", func(t *testing.T) {
		e := su.env(t)
		resp := idem.Response{Status: 200, Header: http.Header{"X-A": {"1"}}, Body: []byte("body")}
		l := e.complete(s, a, resp)
		resp.Header.Set("X-A", "changed")
		resp.Body[0] = 'X'
		want := idem.Response{Status: 200, Header: http.Header{"X-A": {"1"}}, Body: []byte("body")}
		got := e.get(s)
		assertResponse(t, want, got)
		got.Response.Header.Set("X-A", "changed")
		got.Response.Body[0] = 'X'
		assertResponse(t, want, e.get(s))
		assertResponse(t, want, e.replay(s, a))
		lr := l.Record()
		if len(lr.Response.Body) > 0 {
			lr.Response.Body[0] = 'X'
		}
		assertResponse(t, want, e.get(s))
	})
}

// testConcurrentClaims has many callers claim the same keys at once, each
// in its own order.
func (su *suite) testConcurrentClaims(t *testing.T) {
	t.Run("one winner per key", func(t *testing.T) {
		// Winners of even keys hold them until every worker has claimed
		// every key, so that each such key meets all its rivals while held;
		// winners of odd keys complete at once, so that claims meet
		// completions in every order.
		const workers, keys = 64, 8
		e := su.env(t)
		var (
			mu      sync.Mutex
			winners = map[string][]int{}
			replays = map[string][]string{}
			start   = make(chan struct{})
			claimed sync.WaitGroup // every worker has claimed every key
			done    sync.WaitGroup
		)
		answer := func(w int) idem.Response {
			return idem.Response{Status: 200, Body: fmt.Appendf(nil, "winner %d", w)}
		}
		claimed.Add(workers)
		done.Add(workers)
		for w := range workers {
			go func() {
				defer done.Done()
				<-start
				var held []idem.Lease
				rng := rand.New(rand.NewPCG(uint64(w), 1))
				for _, i := range rng.Perm(keys) {
					key := fmt.Sprint("key-", i)
					l, rec, err := e.store.Claim(t.Context(), scope(key), fingerprint("same"))
					switch {
					case err == nil && l != nil:
						mu.Lock()
						winners[key] = append(winners[key], w)
						mu.Unlock()
						if i%2 == 0 {
							held = append(held, l)
						} else {
							assert.NoError(t, l.Complete(t.Context(), answer(w)), "winner %d of %s completes", w, key)
						}
					case err == nil && rec != nil:
						mu.Lock()
						replays[key] = append(replays[key], string(rec.Response.Body))
						mu.Unlock()
					case !errors.Is(err, idem.ErrInProgress):
						t.Errorf("claim %s: %v, want a lease, a replay or ErrInProgress", key, err)
					}
				}
				claimed.Done()
				claimed.Wait()
				for _, l := range held {
					assert.NoError(t, l.Complete(t.Context(), answer(w)), "winner %d of %s completes", w, l.Scope().Key)
				}
			}()
		}
		close(start)
		done.Wait()
		require.Len(t, winners, keys, "every key is won")
		for key, ws := range winners {
			if !assert.Len(t, ws, 1, "key %s won by %v", key, ws) {
				continue
			}
			want := fmt.Sprintf("winner %d", ws[0])
			for _, body := range replays[key] {
				assert.Equal(t, want, body, "replay of %s", key)
			}
			assert.Equal(t, want, string(e.replay(scope(key), fingerprint("same")).Response.Body), "stored answer of %s", key)
		}
	})
}

// testScopes checks that a key is unique within its tenant and endpoint
// and nowhere else.
func (su *suite) testScopes(t *testing.T) {
	t.Run("tenants and endpoints stay apart", func(t *testing.T) {
		e := su.env(t)
		scopes := []idem.Scope{
			{Tenant: "a", Endpoint: "POST /x", Key: "same"},
			{Tenant: "b", Endpoint: "POST /x", Key: "same"},
			{Tenant: "a", Endpoint: "POST /y", Key: "same"},
			// Parts that would run together if joined without care.
			{Tenant: "a", Endpoint: "bc", Key: "k"},
			{Tenant: "ab", Endpoint: "c", Key: "k"},
			{Tenant: "t", Endpoint: "e", Key: "kk"},
			{Tenant: "t", Endpoint: "ek", Key: "k"},
		}
		for i, s := range scopes {
			e.complete(s, fingerprint(fmt.Sprint(i)), idem.Response{Status: 200, Body: []byte(s.Tenant + "|" + s.Endpoint + "|" + s.Key)})
		}
		for i, s := range scopes {
			rec := e.replay(s, fingerprint(fmt.Sprint(i)))
			assert.Equal(t, s, rec.Scope)
			assert.Equal(t, s.Tenant+"|"+s.Endpoint+"|"+s.Key, string(rec.Response.Body))
		}
	})

	t.Run("empty tenant and endpoint are scopes", func(t *testing.T) {
		e := su.env(t)
		scopes := []idem.Scope{{Key: "k"}, {Tenant: "t", Key: "k"}, {Endpoint: "e", Key: "k"}, {Tenant: "t", Endpoint: "e", Key: "k"}}
		ls := make([]idem.Lease, len(scopes))
		for i, s := range scopes {
			ls[i] = e.claim(s, fingerprint(fmt.Sprint(i)))
		}
		require.NoError(t, ls[0].Complete(t.Context(), paid))
		for i, s := range scopes[1:] {
			assert.Equal(t, idem.StateInProgress, e.get(s).State, "completing %v touched %v", scopes[0], s)
			assert.Equal(t, fingerprint(fmt.Sprint(i+1)), e.get(s).Fingerprint)
		}
		assertResponse(t, paid, e.replay(scopes[0], fingerprint("0")))
	})
}

// testExpiry checks that a record lives for its TTL and not beyond.
func (su *suite) testExpiry(t *testing.T) {
	t.Run("a record lives until its TTL", func(t *testing.T) {
		s := scope("k1")
		e := su.env(t)
		l := e.complete(s, fingerprint("a"), paid)
		ttl := ttlOf(l.Record())
		early := min(time.Second, ttl/10)
		e.clock.Advance(ttl - early)
		assertResponse(t, paid, e.replay(s, fingerprint("a")))
		e.clock.Advance(early)
		e.absent(s)
		if e.op != nil {
			for rec, err := range e.op.Records(t.Context(), idem.Filter{}) {
				require.NoError(t, err)
				t.Errorf("an expired record is listed: %q", rec.Scope.Key)
			}
		}
		newer := e.claim(s, fingerprint("b"))
		assert.Equal(t, fingerprint("b"), newer.Record().Fingerprint)
		assert.WithinDuration(t, e.clock.Now(), newer.Record().CreatedAt, time.Millisecond)
		assert.Equal(t, uint32(1), newer.Record().Attempts, "a claim after expiry starts afresh")
	})

	t.Run("an expired claim is absent", func(t *testing.T) {
		s := scope("k1")
		e := su.env(t)
		l := e.claim(s, fingerprint("a"))
		e.clock.Advance(ttlOf(l.Record()))
		e.absent(s)
		e.claim(s, fingerprint("a"))
	})
}

// testBodies checks which bodies are kept and how omitted ones are
// described.
func (su *suite) testBodies(t *testing.T) {
	for _, tt := range []struct {
		name    string
		size    int
		omitted bool
	}{
		{"empty", 0, false},
		{"small", 100, false},
		{"at the limit", int(su.limits.MaxBodyBytes), false},
		{"over the limit", int(su.limits.MaxBodyBytes) + 1, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := su.env(t)
			s := scope("k1")
			body := make([]byte, tt.size)
			for i := range body {
				body[i] = byte(i*7 + tt.size)
			}
			e.complete(s, fingerprint("a"), idem.Response{Status: 200, Body: body})
			for from, rec := range map[string]*idem.Record{"replay": e.replay(s, fingerprint("a")), "get": e.get(s)} {
				assert.Equal(t, int64(tt.size), rec.BodyLen, from)
				assert.Equal(t, sha256.Sum256(body), rec.BodyDigest, from)
				assert.Equal(t, tt.omitted, rec.BodyOmitted, from)
				if tt.omitted || tt.size == 0 {
					assert.Empty(t, rec.Response.Body, from)
				} else {
					assert.True(t, string(body) == string(rec.Response.Body), "%s: a body of %d bytes came back as %d", from, tt.size, len(rec.Response.Body))
				}
			}
		})
	}
}

// waitFor starts Wait on s and returns its result's channel, after
// checking for blockCheck that it does not return while s is held.
func (e *env) waitFor(ctx context.Context, s idem.Scope) <-chan error {
	e.t.Helper()
	woke := make(chan error, 1)
	go func() { woke <- e.store.Wait(ctx, s) }()
	select {
	case err := <-woke:
		e.t.Fatalf("Wait returned (%v) while the key was held", err)
	case <-time.After(blockCheck):
	}
	return woke
}

// woken requires the waiter on woke to return within wakeBound.
func woken(t *testing.T, woke <-chan error) error {
	t.Helper()
	select {
	case err := <-woke:
		return err
	case <-time.After(wakeBound):
		t.Fatalf("Wait did not return within %s", wakeBound)
		return nil
	}
}

// testWait checks when Wait blocks and what wakes it.
func (su *suite) testWait(t *testing.T) {
	s, a := scope("k1"), fingerprint("a")
	t.Run("returns at once when nothing runs", func(t *testing.T) {
		e := su.env(t)
		ctx, cancel := context.WithTimeout(t.Context(), wakeBound)
		defer cancel()
		assert.NoError(t, e.store.Wait(ctx, scope("absent")))
		e.complete(scope("done"), a, paid)
		assert.NoError(t, e.store.Wait(ctx, scope("done")))
		require.NoError(t, e.claim(scope("unknown"), a).MarkUnknown(t.Context()))
		assert.NoError(t, e.store.Wait(ctx, scope("unknown")))
	})

	t.Run("returns at once when the lease ran out", func(t *testing.T) {
		e := su.env(t)
		l := e.claim(s, a)
		e.clock.Advance(leaseOf(l.Record()))
		ctx, cancel := context.WithTimeout(t.Context(), wakeBound)
		defer cancel()
		assert.NoError(t, e.store.Wait(ctx, s), "an overdue claim is not worth waiting for")
	})

	for _, end := range leaseEnds {
		if end.state == idem.StateInProgress {
			continue
		}
		t.Run("woken by "+end.name, func(t *testing.T) {
			e := su.env(t)
			l := e.claim(s, a)
			ctx, cancel := context.WithTimeout(t.Context(), wakeBound)
			defer cancel()
			woke := e.waitFor(ctx, s)
			require.NoError(t, end.call(t.Context(), l))
			require.NoError(t, woken(t, woke))
			_, _, err := e.store.Claim(t.Context(), s, a)
			assert.NotErrorIs(t, err, idem.ErrInProgress, "the key is no longer held after the wake-up")
		})
	}

	t.Run("woken by close", func(t *testing.T) {
		e := su.env(t)
		e.claim(s, a)
		ctx, cancel := context.WithTimeout(t.Context(), wakeBound)
		defer cancel()
		woke := e.waitFor(ctx, s)
		require.NoError(t, e.store.Close())
		if err := woken(t, woke); err != nil {
			assert.ErrorIs(t, err, idem.ErrClosed)
		}
	})

	t.Run("gives up with its context", func(t *testing.T) {
		e := su.env(t)
		e.claim(s, a)
		done, cancel := context.WithCancel(t.Context())
		cancel()
		assert.ErrorIs(t, e.store.Wait(done, s), context.Canceled)

		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		woke := e.waitFor(ctx, s)
		cancel()
		assert.ErrorIs(t, woken(t, woke), context.Canceled)
		assert.Equal(t, idem.StateInProgress, e.get(s).State)
	})
}

// testInvalidInput checks that out-of-range scopes and responses are
// refused before anything is written.
func (su *suite) testInvalidInput(t *testing.T) {
	t.Run("scopes out of range are refused", func(t *testing.T) {
		e := su.env(t)
		bad := []idem.Scope{
			{Tenant: "t", Endpoint: "e", Key: ""},
			{Tenant: "t", Endpoint: "e", Key: strings.Repeat("k", idem.MaxKeyBytes+1)},
			{Tenant: strings.Repeat("t", idem.MaxTenantBytes+1), Endpoint: "e", Key: "k"},
			{Tenant: "t", Endpoint: strings.Repeat("e", idem.MaxEndpointBytes+1), Key: "k"},
		}
		for _, s := range bad {
			_, _, err := e.store.Claim(t.Context(), s, fingerprint("a"))
			assert.ErrorIs(t, err, idem.ErrInvalidScope)
			_, err = e.store.Get(t.Context(), s)
			assert.ErrorIs(t, err, idem.ErrInvalidScope)
			assert.ErrorIs(t, e.store.Wait(t.Context(), s), idem.ErrInvalidScope)
			if e.op != nil {
				_, err = e.op.TakeOver(t.Context(), s)
				assert.ErrorIs(t, err, idem.ErrInvalidScope)
			}
		}
		// Nothing was stored under a shortened form of a bad scope.
		e.absent(idem.Scope{Tenant: "t", Endpoint: "e", Key: strings.Repeat("k", idem.MaxKeyBytes)})
		e.absent(idem.Scope{Tenant: strings.Repeat("t", idem.MaxTenantBytes), Endpoint: "e", Key: "k"})
		e.absent(idem.Scope{Tenant: "t", Endpoint: strings.Repeat("e", idem.MaxEndpointBytes), Key: "k"})
		if e.op != nil {
			for rec, err := range e.op.Records(t.Context(), idem.Filter{Expired: true}) {
				require.NoError(t, err)
				t.Errorf("a refused scope left a record: %+v", rec.Scope)
			}
		}
		// The limits are inclusive.
		edge := idem.Scope{Tenant: strings.Repeat("t", idem.MaxTenantBytes), Endpoint: strings.Repeat("e", idem.MaxEndpointBytes), Key: strings.Repeat("k", idem.MaxKeyBytes)}
		e.complete(edge, fingerprint("a"), paid)
		assertResponse(t, paid, e.replay(edge, fingerprint("a")))
	})

	t.Run("statuses out of range are refused", func(t *testing.T) {
		e := su.env(t)
		s := scope("k1")
		l := e.claim(s, fingerprint("a"))
		e.unchanged(s, "a refused response", func() {
			for _, status := range []int{0, 99, 1000, -1} {
				assert.ErrorIs(t, l.Complete(t.Context(), idem.Response{Status: status}), idem.ErrInvalidResponse, "status %d", status)
			}
		})
		assert.Equal(t, idem.StateInProgress, e.get(s).State)
		require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 999}), "the lease survives a refused response, and 999 is in range")
		assert.Equal(t, 999, e.replay(s, fingerprint("a")).Response.Status)
		e.complete(scope("k2"), fingerprint("a"), idem.Response{Status: 100})
	})
	t.Run("headers over the caps are refused", func(t *testing.T) {
		e := su.env(t)
		s := scope("k1")
		l := e.claim(s, fingerprint("a"))
		many := http.Header{}
		for i := range idem.MaxResponseHeaders + 1 {
			many.Add(fmt.Sprintf("X-H%d", i), "v")
		}
		large := http.Header{"X-Large": {strings.Repeat("v", idem.MaxResponseHeaderBytes)}}
		e.unchanged(s, "a refused header", func() {
			for name, h := range map[string]http.Header{"too many values": many, "too many bytes": large} {
				assert.ErrorIs(t, l.Complete(t.Context(), idem.Response{Status: 200, Header: h}), idem.ErrInvalidResponse, name)
			}
		})
		require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 200, Header: http.Header{"X-Ok": {"v"}}}), "the lease survives")
		assert.Equal(t, "v", e.replay(s, fingerprint("a")).Response.Header.Get("X-Ok"))
	})
}

// testContext checks that a call whose context is done does nothing.
func (su *suite) testContext(t *testing.T) {
	t.Run("a canceled call does nothing", func(t *testing.T) {
		e := su.env(t)
		s := scope("k1")
		done, cancel := context.WithCancel(t.Context())
		cancel()
		_, _, err := e.store.Claim(done, s, fingerprint("a"))
		require.ErrorIs(t, err, context.Canceled)
		e.absent(s)
		_, err = e.store.Get(done, s)
		assert.ErrorIs(t, err, context.Canceled)
		assert.ErrorIs(t, e.store.Ping(done), context.Canceled)

		l := e.claim(s, fingerprint("a"))
		e.unchanged(s, "a canceled lease call", func() {
			for _, end := range leaseEnds {
				assert.ErrorIs(t, end.call(done, l), context.Canceled, end.name)
			}
		})
		require.NoError(t, l.Complete(t.Context(), paid), "a canceled call leaves the lease held")
	})
}

// testClosed checks that a closed store refuses every call.
func (su *suite) testClosed(t *testing.T) {
	t.Run("every call fails with ErrClosed", func(t *testing.T) {
		e := su.env(t)
		ctx := t.Context()
		s := scope("k1")
		require.NoError(t, e.store.Ping(ctx))
		l := e.claim(s, fingerprint("a"))
		require.NoError(t, e.store.Close())
		assert.NoError(t, e.store.Close(), "a second Close returns the first one's result")

		_, _, err := e.store.Claim(ctx, scope("k2"), fingerprint("a"))
		assert.ErrorIs(t, err, idem.ErrClosed, "claim")
		_, err = e.store.Get(ctx, s)
		assert.ErrorIs(t, err, idem.ErrClosed, "get")
		assert.ErrorIs(t, e.store.Wait(ctx, s), idem.ErrClosed, "wait")
		assert.ErrorIs(t, e.store.Ping(ctx), idem.ErrClosed, "ping")
		for _, end := range leaseEnds {
			assert.ErrorIs(t, end.call(ctx, l), idem.ErrClosed, end.name)
		}
		if e.op == nil {
			return
		}
		var listErr error
		for _, err := range e.op.Records(ctx, idem.Filter{}) {
			listErr = err
			break
		}
		assert.ErrorIs(t, listErr, idem.ErrClosed, "records")
		_, err = e.op.TakeOver(ctx, s)
		assert.ErrorIs(t, err, idem.ErrClosed, "take-over")
		_, err = e.op.Overdue(ctx, 0)
		assert.ErrorIs(t, err, idem.ErrClosed, "overdue")
		_, err = e.op.Reconcile(ctx)
		assert.ErrorIs(t, err, idem.ErrClosed, "reconcile")
		_, err = e.op.Sweep(ctx)
		assert.ErrorIs(t, err, idem.ErrClosed, "sweep")
		_, err = e.op.Compact(ctx, nil)
		assert.ErrorIs(t, err, idem.ErrClosed, "compact")
		_, err = e.op.Metrics(ctx)
		assert.ErrorIs(t, err, idem.ErrClosed, "metrics")
	})
}

// testOperator checks the calls of idem.Operator.
func (su *suite) testOperator(t *testing.T) {
	a := fingerprint("a")
	t.Run("take-over refuses absent, held and completed records", func(t *testing.T) {
		e := su.env(t)
		_, err := e.op.TakeOver(t.Context(), scope("absent"))
		assert.ErrorIs(t, err, idem.ErrNotFound)
		l := e.claim(scope("held"), a)
		e.unchanged(scope("held"), "a refused take-over", func() {
			_, err = e.op.TakeOver(t.Context(), scope("held"))
			ke := keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)
			assert.Positive(t, ke.RetryAfter)
			assert.LessOrEqual(t, ke.RetryAfter, leaseOf(l.Record()))
		})
		e.complete(scope("done"), a, paid)
		e.unchanged(scope("done"), "a refused take-over", func() {
			_, err = e.op.TakeOver(t.Context(), scope("done"))
			assert.ErrorIs(t, err, idem.ErrCompleted)
		})
	})

	t.Run("take-over of an overdue claim grants a new lease", func(t *testing.T) {
		e := su.env(t)
		s := scope("k1")
		old := e.claim(s, a)
		lease := leaseOf(old.Record())
		e.clock.Advance(lease)
		l, err := e.op.TakeOver(t.Context(), s)
		require.NoError(t, err)
		rec := l.Record()
		assert.Equal(t, idem.StateInProgress, rec.State)
		assert.Equal(t, uint32(2), rec.Attempts)
		assert.Equal(t, a, rec.Fingerprint, "a take-over keeps the request's fingerprint")
		assert.WithinDuration(t, e.clock.Now().Add(lease), rec.LeaseUntil, time.Millisecond)
		_, _, err = e.store.Claim(t.Context(), s, a)
		keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)
		require.NoError(t, l.Complete(t.Context(), paid))
		assertResponse(t, paid, e.replay(s, a))
		m, err := e.op.Metrics(t.Context())
		require.NoError(t, err)
		assert.Equal(t, int64(1), m.Events[idem.EventTakenOver], "a take-over is counted")
	})

	t.Run("take-over settles unknown and failed records", func(t *testing.T) {
		e := su.env(t)
		require.NoError(t, e.claim(scope("unknown"), a).MarkUnknown(t.Context()))
		require.NoError(t, e.claim(scope("failed"), a).MarkFailed(t.Context()))
		l, err := e.op.TakeOver(t.Context(), scope("unknown"))
		require.NoError(t, err)
		require.NoError(t, l.Release(t.Context()))
		e.claim(scope("unknown"), a)
		l, err = e.op.TakeOver(t.Context(), scope("failed"))
		require.NoError(t, err)
		require.NoError(t, l.Complete(t.Context(), paid))
		assertResponse(t, paid, e.replay(scope("failed"), a))
	})

	t.Run("overdue lists claims past their lease, oldest first", func(t *testing.T) {
		e := su.env(t)
		first := e.claim(scope("first"), a)
		lease := leaseOf(first.Record())
		e.clock.Advance(lease / 4)
		e.claim(scope("second"), a)
		e.complete(scope("done"), a, paid)
		require.NoError(t, e.claim(scope("unknown"), a).MarkUnknown(t.Context()))
		e.clock.Advance(lease)
		e.claim(scope("young"), a)

		recs, err := e.op.Overdue(t.Context(), 0)
		require.NoError(t, err)
		assert.Equal(t, []string{"first", "second"}, recordKeys(recs))
		recs, err = e.op.Overdue(t.Context(), 1)
		require.NoError(t, err)
		assert.Equal(t, []string{"first"}, recordKeys(recs))

		res, err := e.op.Reconcile(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 2, res.Overdue)
		assert.LessOrEqual(t, res.Resolved, res.Overdue)
	})

	t.Run("records select by filter", func(t *testing.T) {
		e := su.env(t)
		in := func(tenant, endpoint, key string) idem.Scope {
			return idem.Scope{Tenant: tenant, Endpoint: endpoint, Key: key}
		}
		old := e.complete(in("acme", "POST /a", "old"), a, paid)
		ttl := ttlOf(old.Record())
		e.clock.Advance(ttl / 2)
		mid := e.clock.Now()
		e.complete(in("acme", "POST /a", "k1"), a, paid)
		e.claim(in("acme", "POST /b", "k2"), a)
		require.NoError(t, e.claim(in("other", "POST /a", "k3"), a).MarkUnknown(t.Context()))
		e.clock.Advance(ttl - ttl/2)

		for _, tt := range []struct {
			f    idem.Filter
			want []string
		}{
			{idem.Filter{}, []string{"k1", "k2", "k3"}},
			{idem.Filter{Tenant: "acme"}, []string{"k1", "k2"}},
			{idem.Filter{Endpoint: "POST /a"}, []string{"k1", "k3"}},
			{idem.Filter{Tenant: "acme", Endpoint: "POST /a"}, []string{"k1"}},
			{idem.Filter{State: idem.StateCompleted}, []string{"k1"}},
			{idem.Filter{State: idem.StateUnknown}, []string{"k3"}},
			{idem.Filter{Expired: true}, []string{"old", "k1", "k2", "k3"}},
			{idem.Filter{CreatedBefore: mid, Expired: true}, []string{"old"}},
		} {
			var got []*idem.Record
			for rec, err := range e.op.Records(t.Context(), tt.f) {
				require.NoError(t, err)
				got = append(got, rec)
			}
			assert.ElementsMatch(t, tt.want, recordKeys(got), "%+v", tt.f)
			for _, rec := range got {
				assert.True(t, tt.f.Match(rec, e.clock.Now()), "%+v listed %q, which it does not select", tt.f, rec.Scope.Key)
			}
		}
	})

	t.Run("sweep deletes expired records", func(t *testing.T) {
		e := su.env(t)
		old := e.claim(scope("old"), a)
		lease, ttl := leaseOf(old.Record()), ttlOf(old.Record())
		require.NoError(t, old.Complete(t.Context(), paid))
		require.NoError(t, e.claim(scope("lost"), a).MarkUnknown(t.Context()))
		e.clock.Advance(lease)
		e.claim(scope("young"), a)
		e.clock.Advance(ttl - lease)

		m, err := e.op.Metrics(t.Context())
		require.NoError(t, err)
		assert.Equal(t, int64(2), m.Expired)
		res, err := e.op.Sweep(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 2, res.Records)
		assert.Positive(t, res.Bytes)
		var left []*idem.Record
		for rec, err := range e.op.Records(t.Context(), idem.Filter{Expired: true}) {
			require.NoError(t, err)
			left = append(left, rec)
		}
		assert.Equal(t, []string{"young"}, recordKeys(left))
		m, err = e.op.Metrics(t.Context())
		require.NoError(t, err)
		assert.Zero(t, m.Expired)
		assert.Zero(t, m.UnknownRecords)
		assert.Equal(t, int64(2), m.Events[idem.EventSwept])
		res, err = e.op.Sweep(t.Context())
		require.NoError(t, err)
		assert.Zero(t, res.Records, "a second sweep finds nothing")
	})

	t.Run("compact sweeps expired records", func(t *testing.T) {
		e := su.env(t)
		old := e.complete(scope("old"), a, paid)
		e.clock.Advance(ttlOf(old.Record()))
		e.claim(scope("young"), a)
		res, err := e.op.Compact(t.Context(), nil)
		require.NoError(t, err)
		assert.Equal(t, 1, res.Records)
		var left []*idem.Record
		for rec, err := range e.op.Records(t.Context(), idem.Filter{Expired: true}) {
			require.NoError(t, err)
			left = append(left, rec)
		}
		assert.Equal(t, []string{"young"}, recordKeys(left))
	})

	t.Run("metrics count events and records", func(t *testing.T) {
		e := su.env(t)
		ctx := t.Context()
		done := e.claim(scope("done"), a)
		lease, ttl := leaseOf(done.Record()), ttlOf(done.Record())
		require.NoError(t, done.Complete(ctx, paid))
		e.replay(scope("done"), a)
		_, _, err := e.store.Claim(ctx, scope("done"), fingerprint("b"))
		require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
		e.claim(scope("running"), a)
		_, _, err = e.store.Claim(ctx, scope("running"), a)
		require.ErrorIs(t, err, idem.ErrInProgress)
		require.NoError(t, e.claim(scope("gone"), a).Release(ctx))
		require.NoError(t, e.claim(scope("lost"), a).MarkUnknown(ctx))
		require.NoError(t, e.claim(scope("failed"), a).MarkFailed(ctx))
		e.clock.Advance(lease / 4)
		e.claim(scope("young"), a)
		e.clock.Advance(lease - lease/4)
		_, _, err = e.store.Claim(ctx, scope("running"), a)
		require.ErrorIs(t, err, idem.ErrOutcomePending)

		m, err := e.op.Metrics(ctx)
		require.NoError(t, err)
		var events [idem.NumEvents]int64
		events[idem.EventClaimed] = 6
		for _, e := range []idem.Event{idem.EventReplayed, idem.EventConflict, idem.EventMismatch,
			idem.EventPending, idem.EventCompleted, idem.EventReleased, idem.EventUnknown, idem.EventFailed} {
			events[e] = 1
		}
		want := idem.Metrics{
			Events:     events,
			InProgress: 2, Overdue: 1, OldestInProgress: lease,
			UnknownRecords: 1, FailedRecords: 1,
			Engine: m.Engine, // the backend's own
		}
		assert.Equal(t, want, m)

		e.clock.Advance(ttl)
		m, err = e.op.Metrics(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(5), m.Expired, "every record but the released one has expired")
		_, err = e.op.Sweep(ctx)
		require.NoError(t, err)
		m, err = e.op.Metrics(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(5), m.Events[idem.EventSwept])
		assert.Zero(t, m.Expired)
		assert.Zero(t, m.InProgress)
		assert.Zero(t, m.UnknownRecords)
		assert.Zero(t, m.FailedRecords)
	})
}

// recordKeys returns the keys of recs, in order.
func recordKeys(recs []*idem.Record) []string {
	keys := make([]string, 0, len(recs))
	for _, rec := range recs {
		keys = append(keys, rec.Scope.Key)
	}
	return keys
}
