package pebblestore_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	fake "github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/pebblestore"
)

var ctx = context.Background()

func fp(s string) idem.Fingerprint { return sha256.Sum256([]byte(s)) }

func scope(key string) idem.Scope {
	return idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: key}
}

var paid = idem.Response{
	Status: 201,
	Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}},
	Body:   []byte(`{"id":"pay_1","status":"succeeded"}`),
}

func claim(t *testing.T, db *pebblestore.Store, s idem.Scope, f idem.Fingerprint) idem.Lease {
	t.Helper()
	l, rec, err := db.Claim(ctx, s, f)
	require.NoError(t, err)
	require.Nil(t, rec)
	require.NotNil(t, l)
	return l
}

// keyErr asserts that err is a *KeyError wrapping want in state st.
func keyErr(t *testing.T, err error, want error, st idem.State) *idem.KeyError {
	t.Helper()
	require.ErrorIs(t, err, want)
	var ke *idem.KeyError
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, st, ke.State)
	assert.NotContains(t, err.Error(), "k1", "error strings must not carry the raw key")
	return ke
}

// TestClaimTransitions walks every state a record can be in and checks what
// a claim of it gets, and that a refused claim changes nothing stored.
func TestClaimTransitions(t *testing.T) {
	const lease = 30 * time.Second
	s, f := scope("k1"), fp("a")
	tests := []struct {
		name  string
		setup func(t *testing.T, db *pebblestore.Store, c *fake.Clock)
		fp    idem.Fingerprint
		check func(t *testing.T, l idem.Lease, rec *idem.Record, err error)
	}{
		{
			name:  "fresh key is won",
			setup: func(t *testing.T, db *pebblestore.Store, c *fake.Clock) {},
			fp:    f,
			check: func(t *testing.T, l idem.Lease, rec *idem.Record, err error) {
				require.NoError(t, err)
				assert.Nil(t, rec)
				require.NotNil(t, l)
				assert.Equal(t, s, l.Scope())
				assert.Equal(t, idem.StateInProgress, l.Record().State)
				assert.Equal(t, uint32(1), l.Record().Attempts)
			},
		},
		{
			name: "completed, same fingerprint replays",
			setup: func(t *testing.T, db *pebblestore.Store, c *fake.Clock) {
				require.NoError(t, claim(t, db, s, f).Complete(ctx, paid))
			},
			fp: f,
			check: func(t *testing.T, l idem.Lease, rec *idem.Record, err error) {
				require.NoError(t, err)
				assert.Nil(t, l)
				require.NotNil(t, rec)
				assert.Equal(t, idem.StateCompleted, rec.State)
				assert.Equal(t, paid, rec.Response)
				assert.Equal(t, f, rec.Fingerprint)
				assert.Equal(t, s, rec.Scope)
			},
		},
		{
			name: "completed, other fingerprint is refused for good",
			setup: func(t *testing.T, db *pebblestore.Store, c *fake.Clock) {
				require.NoError(t, claim(t, db, s, f).Complete(ctx, paid))
			},
			fp: fp("b"),
			check: func(t *testing.T, l idem.Lease, rec *idem.Record, err error) {
				ke := keyErr(t, err, idem.ErrFingerprintMismatch, idem.StateCompleted)
				assert.Zero(t, ke.RetryAfter)
			},
		},
		{
			name: "in progress, same fingerprint: retry later",
			setup: func(t *testing.T, db *pebblestore.Store, c *fake.Clock) {
				claim(t, db, s, f)
				c.Advance(lease - 300*time.Millisecond)
			},
			fp: f,
			check: func(t *testing.T, l idem.Lease, rec *idem.Record, err error) {
				ke := keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)
				assert.Equal(t, 300*time.Millisecond, ke.RetryAfter, "never beyond the lease's end")
			},
		},
		{
			name:  "in progress, retry hint is capped at a second",
			setup: func(t *testing.T, db *pebblestore.Store, c *fake.Clock) { claim(t, db, s, f) },
			fp:    f,
			check: func(t *testing.T, l idem.Lease, rec *idem.Record, err error) {
				ke := keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)
				assert.Equal(t, time.Second, ke.RetryAfter)
			},
		},
		{
			name:  "in progress, other fingerprint",
			setup: func(t *testing.T, db *pebblestore.Store, c *fake.Clock) { claim(t, db, s, f) },
			fp:    fp("b"),
			check: func(t *testing.T, l idem.Lease, rec *idem.Record, err error) {
				keyErr(t, err, idem.ErrFingerprintMismatch, idem.StateInProgress)
			},
		},
		{
			name: "in progress past its lease is not re-run",
			setup: func(t *testing.T, db *pebblestore.Store, c *fake.Clock) {
				claim(t, db, s, f)
				c.Advance(lease)
			},
			fp: f,
			check: func(t *testing.T, l idem.Lease, rec *idem.Record, err error) {
				keyErr(t, err, idem.ErrOutcomePending, idem.StateInProgress)
			},
		},
		{
			name: "extended lease is still in progress",
			setup: func(t *testing.T, db *pebblestore.Store, c *fake.Clock) {
				l := claim(t, db, s, f)
				c.Advance(lease - time.Second)
				require.NoError(t, l.Extend(ctx))
				c.Advance(lease - time.Second)
			},
			fp: f,
			check: func(t *testing.T, l idem.Lease, rec *idem.Record, err error) {
				keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)
			},
		},
		{
			name: "unknown waits for resolution",
			setup: func(t *testing.T, db *pebblestore.Store, c *fake.Clock) {
				require.NoError(t, claim(t, db, s, f).MarkUnknown(ctx))
			},
			fp: f,
			check: func(t *testing.T, l idem.Lease, rec *idem.Record, err error) {
				keyErr(t, err, idem.ErrOutcomePending, idem.StateUnknown)
			},
		},
		{
			name: "failed waits for resolution",
			setup: func(t *testing.T, db *pebblestore.Store, c *fake.Clock) {
				require.NoError(t, claim(t, db, s, f).MarkFailed(ctx))
			},
			fp: f,
			check: func(t *testing.T, l idem.Lease, rec *idem.Record, err error) {
				keyErr(t, err, idem.ErrOutcomePending, idem.StateFailed)
			},
		},
		{
			name: "released key runs again, even with another payload",
			setup: func(t *testing.T, db *pebblestore.Store, c *fake.Clock) {
				require.NoError(t, claim(t, db, s, f).Release(ctx))
			},
			fp: fp("b"),
			check: func(t *testing.T, l idem.Lease, rec *idem.Record, err error) {
				require.NoError(t, err)
				require.NotNil(t, l)
				assert.Equal(t, fp("b"), l.Record().Fingerprint)
			},
		},
		{
			name: "expired completed record counts as absent",
			setup: func(t *testing.T, db *pebblestore.Store, c *fake.Clock) {
				require.NoError(t, claim(t, db, s, f).Complete(ctx, paid))
				c.Advance(24 * time.Hour)
			},
			fp: fp("b"),
			check: func(t *testing.T, l idem.Lease, rec *idem.Record, err error) {
				require.NoError(t, err)
				require.NotNil(t, l)
			},
		},
		{
			name: "expired unknown record counts as absent",
			setup: func(t *testing.T, db *pebblestore.Store, c *fake.Clock) {
				require.NoError(t, claim(t, db, s, f).MarkUnknown(ctx))
				c.Advance(24 * time.Hour)
			},
			fp: f,
			check: func(t *testing.T, l idem.Lease, rec *idem.Record, err error) {
				require.NoError(t, err)
				require.NotNil(t, l)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, clock := idemtest.Open(t, &pebblestore.Options{Lease: lease})
			tt.setup(t, db, clock)
			before, beforeErr := db.Get(ctx, s)
			l, rec, err := db.Claim(ctx, s, tt.fp)
			tt.check(t, l, rec, err)
			if err != nil {
				after, afterErr := db.Get(ctx, s)
				assert.Equal(t, beforeErr, afterErr)
				assert.Equal(t, before, after, "a refused claim changes nothing")
			}
			pebblestore.RequireConsistent(t, db)
		})
	}
}

// TestLeaseTransitions checks what each lease call does from each outcome,
// and that a lease that lost its record can change nothing.
func TestLeaseTransitions(t *testing.T) {
	s, f := scope("k1"), fp("a")
	ends := map[string]func(idem.Lease) error{
		"complete": func(l idem.Lease) error { return l.Complete(ctx, paid) },
		"release":  func(l idem.Lease) error { return l.Release(ctx) },
		"unknown":  func(l idem.Lease) error { return l.MarkUnknown(ctx) },
		"failed":   func(l idem.Lease) error { return l.MarkFailed(ctx) },
		"extend":   func(l idem.Lease) error { return l.Extend(ctx) },
	}
	wantState := map[string]idem.State{
		"complete": idem.StateCompleted, "unknown": idem.StateUnknown,
		"failed": idem.StateFailed, "extend": idem.StateInProgress,
	}
	for first, end := range ends {
		for second, again := range ends {
			t.Run(first+"/then/"+second, func(t *testing.T) {
				db, _ := idemtest.Open(t, nil)
				l := claim(t, db, s, f)
				require.NoError(t, end(l))
				before, beforeErr := db.Get(ctx, s)
				if first == "release" {
					require.ErrorIs(t, beforeErr, idem.ErrNotFound)
				} else {
					require.NoError(t, beforeErr)
					assert.Equal(t, wantState[first], before.State)
				}
				err := again(l)
				if first == "extend" {
					require.NoError(t, err, "an extended lease is still held")
					return
				}
				require.ErrorIs(t, err, idem.ErrLeaseLost)
				after, afterErr := db.Get(ctx, s)
				assert.Equal(t, beforeErr, afterErr)
				assert.Equal(t, before, after)
				pebblestore.RequireConsistent(t, db)
			})
		}
	}
}

// TestSettledClaimsLeaveNoTombstones checks that a claim's pending-index
// entry and its retirement at completion cancel out when flushed, rather
// than leaving a deletion for compactions to carry down the levels.
func TestSettledClaimsLeaveNoTombstones(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	for i := range 50 {
		require.NoError(t, claim(t, db, scope(fmt.Sprint("k", i)), fp("a")).Complete(ctx, paid))
	}
	require.NoError(t, db.FlushMemtable())
	n, err := db.TableDeletions()
	require.NoError(t, err)
	assert.Zero(t, n)
	pending, err := db.CountFamily('p')
	require.NoError(t, err)
	assert.Zero(t, pending)
}

// TestPendingEntryRewrittenInPlaceStaysRetired writes one pending-index key
// twice (an extension on a clock that did not move keeps the lease's end),
// the first write compacted to the last level before the second. The
// completion must retire the entry for good: had the second write not
// retired the first, the completion's single deletion would cancel only
// the second when flushed, and the first would be back.
func TestPendingEntryRewrittenInPlaceStaysRetired(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	l := claim(t, db, scope("k1"), fp("a"))
	require.NoError(t, db.FlushMemtable())
	require.NoError(t, db.CompactStore())
	until := l.Record().LeaseUntil
	require.NoError(t, l.Extend(ctx))
	require.Equal(t, until, l.Record().LeaseUntil, "the clock must not move for the key to stay the same")
	require.NoError(t, l.Complete(ctx, paid))
	require.NoError(t, db.FlushMemtable())
	pending, err := db.CountFamily('p')
	require.NoError(t, err)
	assert.Zero(t, pending)
	m, err := db.Metrics(context.Background())
	require.NoError(t, err)
	assert.Zero(t, m.InProgress)
	pebblestore.RequireConsistent(t, db)
}

func TestInvalidInputChangesNothing(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	bad := []idem.Scope{
		{Tenant: "t", Endpoint: "e", Key: ""},
		{Tenant: "t", Endpoint: "e", Key: strings.Repeat("k", idem.MaxKeyBytes+1)},
		{Tenant: strings.Repeat("t", idem.MaxTenantBytes+1), Endpoint: "e", Key: "k"},
		{Tenant: "t", Endpoint: strings.Repeat("e", idem.MaxEndpointBytes+1), Key: "k"},
	}
	for _, s := range bad {
		_, _, err := db.Claim(ctx, s, fp("a"))
		assert.ErrorIs(t, err, idem.ErrInvalidScope)
		_, err = db.Get(ctx, s)
		assert.ErrorIs(t, err, idem.ErrInvalidScope)
	}
	n, err := db.CountFamily('r')
	require.NoError(t, err)
	assert.Zero(t, n)

	l := claim(t, db, scope("k1"), fp("a"))
	for _, status := range []int{0, 99, 1000, -1} {
		assert.ErrorIs(t, l.Complete(ctx, idem.Response{Status: status}), idem.ErrInvalidResponse)
	}
	rec, err := db.Get(ctx, scope("k1"))
	require.NoError(t, err)
	assert.Equal(t, idem.StateInProgress, rec.State)

	// Limits are inclusive.
	edge := idem.Scope{Tenant: strings.Repeat("t", idem.MaxTenantBytes), Endpoint: strings.Repeat("e", idem.MaxEndpointBytes), Key: strings.Repeat("k", idem.MaxKeyBytes)}
	claim(t, db, edge, fp("a"))
}

func TestSecondOpenOfDirectoryFails(t *testing.T) {
	for name, fs := range map[string]vfs.FS{"mem": vfs.NewMem(), "disk": vfs.Default} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			db, err := pebblestore.Open(dir, pebblefs.With(&pebblestore.Options{SweepInterval: -1}, fs))
			require.NoError(t, err)
			_, err = pebblestore.Open(dir, pebblefs.With(&pebblestore.Options{SweepInterval: -1}, fs))
			require.ErrorIs(t, err, pebblestore.ErrLocked)
			assert.Contains(t, err.Error(), dir)
			require.NoError(t, db.Close())
			again, err := pebblestore.Open(dir, pebblefs.With(&pebblestore.Options{SweepInterval: -1}, fs))
			require.NoError(t, err, "the lock goes with Close")
			require.NoError(t, again.Close())
		})
	}
}

func TestOptionsValidation(t *testing.T) {
	tests := []struct {
		name string
		opts pebblestore.Options
		want []string
	}{
		{"negative TTL", pebblestore.Options{TTL: -time.Second}, []string{"TTL -1s must be positive"}},
		{"TTL near the lease", pebblestore.Options{TTL: time.Minute, Lease: 30 * time.Second}, []string{"at least 10 leases"}},
		{"negative lease", pebblestore.Options{Lease: -1}, []string{"Lease -1ns must be positive"}},
		{"endpoint TTL", pebblestore.Options{EndpointTTL: map[string]time.Duration{"POST /x": time.Second}}, []string{`EndpointTTL["POST /x"]`}},
		{"inline above max", pebblestore.Options{InlineBodyBytes: 2 << 20, MaxBodyBytes: 1 << 20}, []string{"MaxBodyBytes"}},
		{"inline too large", pebblestore.Options{InlineBodyBytes: 32 << 20}, []string{"InlineBodyBytes"}},
		{"max body too large", pebblestore.Options{MaxBodyBytes: 2 << 30}, []string{"MaxBodyBytes"}},
		{"cache too large", pebblestore.Options{CacheBytes: math.MaxInt64}, []string{"CacheBytes"}},
		{"memory too small", pebblestore.Options{MemoryBytes: 1 << 20}, []string{"MemoryBytes 1048576 must be between 4 MiB and 1 TiB"}},
		{"memory and cache", pebblestore.Options{MemoryBytes: 16 << 20, CacheBytes: 1 << 20}, []string{"cannot both be set"}},
		{"negative clock tolerance", pebblestore.Options{ClockTolerance: -time.Second}, []string{"ClockTolerance -1s must be at least a second"}},
		{"clock tolerance under a second", pebblestore.Options{ClockTolerance: time.Millisecond}, []string{"ClockTolerance 1ms"}},
		{"everything reported at once", pebblestore.Options{TTL: -1, Lease: -1, CompactBytes: -1, CacheBytes: -1},
			[]string{"TTL", "Lease", "CompactBytes", "CacheBytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pebblefs.With(&tt.opts, vfs.NewMem())
			_, err := pebblestore.Open("db", &tt.opts)
			require.ErrorIs(t, err, idem.ErrInvalidOptions)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	db, err := pebblestore.Open("db", pebblefs.With(&pebblestore.Options{TTL: 10 * time.Minute, Lease: time.Minute, SweepInterval: -1}, vfs.NewMem()))
	require.NoError(t, err, "exactly ten leases is enough")
	require.NoError(t, db.Close())
}

func TestNilOptionsUseDefaults(t *testing.T) {
	dir := t.TempDir()
	db, err := pebblestore.Open(dir, nil)
	require.NoError(t, err)
	l := claim(t, db, scope("k1"), fp("a"))
	rec := l.Record()
	assert.Equal(t, 24*time.Hour, rec.ExpiresAt.Sub(rec.CreatedAt))
	assert.Equal(t, 30*time.Second, rec.LeaseUntil.Sub(rec.CreatedAt))
	require.NoError(t, db.Close())
}

func TestEndpointTTL(t *testing.T) {
	db, clock := idemtest.Open(t, &pebblestore.Options{EndpointTTL: map[string]time.Duration{"POST /short": time.Hour}})
	short := idem.Scope{Endpoint: "POST /short", Key: "k"}
	long := idem.Scope{Endpoint: "POST /long", Key: "k"}
	require.NoError(t, claim(t, db, short, fp("a")).Complete(ctx, paid))
	require.NoError(t, claim(t, db, long, fp("a")).Complete(ctx, paid))
	clock.Advance(time.Hour)
	_, err := db.Get(ctx, short)
	assert.ErrorIs(t, err, idem.ErrNotFound)
	_, err = db.Get(ctx, long)
	assert.NoError(t, err)
}

func TestBodiesInlineChunkedAndOmitted(t *testing.T) {
	const inline, max = 1 << 10, 200 << 10
	db, _ := idemtest.Open(t, &pebblestore.Options{InlineBodyBytes: inline, MaxBodyBytes: max})
	for _, size := range []int{0, 1, inline, inline + 1, 64 << 10, 64<<10 + 1, 3 * 64 << 10, max, max + 1, 1 << 20} {
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(i*7 + size)
		}
		s := scope(strings.Repeat("b", 1) + string(rune('a'+size%26)) + time.Duration(size).String())
		l := claim(t, db, s, fp("a"))
		require.NoError(t, l.Complete(ctx, idem.Response{Status: 200, Body: body}))
		_, rec, err := db.Claim(ctx, s, fp("a"))
		require.NoError(t, err)
		require.NotNil(t, rec)
		assert.Equal(t, int64(size), rec.BodyLen)
		assert.Equal(t, sha256.Sum256(body), rec.BodyDigest)
		if size > max {
			assert.True(t, rec.BodyOmitted, "size %d", size)
			assert.Empty(t, rec.Response.Body)
		} else {
			assert.False(t, rec.BodyOmitted, "size %d", size)
			assert.Equal(t, body, rec.Response.Body, "size %d", size)
		}
	}
	pebblestore.RequireConsistent(t, db)
}

func TestMetricsCountTransitions(t *testing.T) {
	db, clock := idemtest.Open(t, &pebblestore.Options{Lease: 10 * time.Second})
	done := claim(t, db, scope("done"), fp("a"))
	require.NoError(t, done.Complete(ctx, paid))
	_, _, err := db.Claim(ctx, scope("done"), fp("a")) // replay
	require.NoError(t, err)
	_, _, err = db.Claim(ctx, scope("done"), fp("b")) // mismatch
	require.Error(t, err)
	claim(t, db, scope("running"), fp("a"))
	_, _, err = db.Claim(ctx, scope("running"), fp("a")) // conflict
	require.Error(t, err)
	require.NoError(t, claim(t, db, scope("gone"), fp("a")).Release(ctx))
	require.NoError(t, claim(t, db, scope("lost"), fp("a")).MarkUnknown(ctx))
	clock.Advance(3 * time.Second)
	claim(t, db, scope("young"), fp("a"))
	clock.Advance(8 * time.Second)

	m, err := db.Metrics(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(5), m.Events[idem.EventClaimed])
	assert.Equal(t, int64(1), m.Events[idem.EventReplayed])
	assert.Equal(t, int64(1), m.Events[idem.EventMismatch])
	assert.Equal(t, int64(1), m.Events[idem.EventConflict])
	assert.Equal(t, int64(1), m.Events[idem.EventReleased])
	assert.Equal(t, int64(1), m.Events[idem.EventUnknown])
	assert.Equal(t, int64(1), m.Events[idem.EventCompleted])
	assert.Equal(t, int64(2), m.InProgress)
	assert.Equal(t, int64(1), m.Overdue, "running is past its lease, young is not")
	assert.Equal(t, 11*time.Second, m.OldestInProgress)
	assert.Equal(t, int64(1), m.UnknownRecords)
	assert.Positive(t, figure(t, m, pebblestore.FigureDiskBytes))
	assert.Positive(t, figure(t, m, pebblestore.FigureBytesWritten))
	assert.GreaterOrEqual(t, figure(t, m, pebblestore.FigureCommits), figure(t, m, pebblestore.FigureSyncs))
	assert.Positive(t, figure(t, m, pebblestore.FigureSyncs))
}

func TestDownstreamKey(t *testing.T) {
	a := idem.DownstreamKey(scope("k1"), "charge")
	assert.Equal(t, a, idem.DownstreamKey(scope("k1"), "charge"), "deterministic")
	assert.Len(t, a, 64)
	for _, other := range []string{
		idem.DownstreamKey(scope("k1"), "refund"),
		idem.DownstreamKey(scope("k2"), "charge"),
		idem.DownstreamKey(idem.Scope{Tenant: "acm", Endpoint: "ePOST /v1/payments", Key: "k1"}, "charge"),
	} {
		assert.NotEqual(t, a, other)
	}
}

func TestStateNames(t *testing.T) {
	for _, s := range []idem.State{idem.StateInProgress, idem.StateCompleted, idem.StateFailed, idem.StateUnknown} {
		got, err := idem.ParseState(s.String())
		require.NoError(t, err)
		assert.Equal(t, s, got)
	}
	assert.Equal(t, "none", idem.State(0).String())
	_, err := idem.ParseState("done")
	assert.Error(t, err)
}

func TestKeyErrorUnwraps(t *testing.T) {
	err := error(&idem.KeyError{Err: idem.ErrInProgress, State: idem.StateInProgress, RetryAfter: time.Second})
	assert.True(t, errors.Is(err, idem.ErrInProgress))
	assert.False(t, errors.Is(err, idem.ErrOutcomePending))
	assert.Contains(t, err.Error(), "retry after 1s")
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// figure returns one of the engine's figures, which must be reported.
func figure(t *testing.T, m idem.Metrics, name string) float64 {
	t.Helper()
	v, ok := m.Figure(name)
	require.True(t, ok, "no figure %s", name)
	return v
}
