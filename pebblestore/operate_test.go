package pebblestore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
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

// collect drains db.Records(f) and returns the keys in the order given.
func collect(t *testing.T, db *pebblestore.Store, f idem.Filter) []string {
	t.Helper()
	var keys []string
	for rec, err := range db.Records(ctx, f) {
		require.NoError(t, err)
		keys = append(keys, rec.Scope.Key)
	}
	return keys
}

func TestRecordsFilters(t *testing.T) {
	db, clock := idemtest.Open(t, &pebblestore.Options{Lease: time.Minute, TTL: time.Hour})
	put := func(s idem.Scope, end func(idem.Lease)) {
		l := claim(t, db, s, fp("a"))
		if end != nil {
			end(l)
		}
		clock.Advance(time.Minute)
	}
	complete := func(l idem.Lease) { require.NoError(t, l.Complete(ctx, paid)) }
	unknown := func(l idem.Lease) { require.NoError(t, l.MarkUnknown(ctx)) }
	put(idem.Scope{Tenant: "a", Endpoint: "e1", Key: "old"}, complete)
	put(idem.Scope{Tenant: "a", Endpoint: "e2", Key: "u"}, unknown)
	put(idem.Scope{Tenant: "ab", Endpoint: "e1", Key: "other-tenant"}, complete)
	put(idem.Scope{Tenant: "a", Endpoint: "e1", Key: "running"}, nil)
	put(idem.Scope{Tenant: "", Endpoint: "e1", Key: "no-tenant"}, complete)

	cases := []struct {
		name string
		f    idem.Filter
		want []string
	}{
		{"all", idem.Filter{}, []string{"no-tenant", "old", "running", "u", "other-tenant"}},
		{"tenant is a span, not a prefix", idem.Filter{Tenant: "a"}, []string{"old", "running", "u"}},
		{"tenant and endpoint", idem.Filter{Tenant: "a", Endpoint: "e1"}, []string{"old", "running"}},
		{"endpoint alone", idem.Filter{Endpoint: "e1"}, []string{"no-tenant", "old", "running", "other-tenant"}},
		{"state", idem.Filter{State: idem.StateUnknown}, []string{"u"}},
		{"created before", idem.Filter{CreatedBefore: fake.NewClock().Now().Add(2 * time.Minute)}, []string{"old", "u"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, collect(t, db, c.f))
		})
	}

	// Scopes come back whole, and inline bodies with them.
	for rec, err := range db.Records(ctx, idem.Filter{Tenant: "a", Endpoint: "e1", State: idem.StateCompleted}) {
		require.NoError(t, err)
		assert.Equal(t, idem.Scope{Tenant: "a", Endpoint: "e1", Key: "old"}, rec.Scope)
		assert.Equal(t, paid.Body, rec.Response.Body)
	}

	// Past the TTL, records are listed only on request.
	clock.Advance(time.Hour - 4*time.Minute)
	assert.Equal(t, []string{"no-tenant", "running", "other-tenant"}, collect(t, db, idem.Filter{}))
	assert.Len(t, collect(t, db, idem.Filter{Expired: true}), 5)
	m, err := db.Metrics(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(2), m.Expired)
	_, err = db.Sweep(ctx)
	require.NoError(t, err)
	m, err = db.Metrics(context.Background())
	require.NoError(t, err)
	assert.Zero(t, m.Expired)
	assert.Len(t, collect(t, db, idem.Filter{Expired: true}), 3)

	// Breaking off the loop early is fine, and the store still closes.
	for range db.Records(ctx, idem.Filter{}) {
		break
	}
	require.NoError(t, db.Close())
	for _, err := range db.Records(ctx, idem.Filter{}) {
		assert.ErrorIs(t, err, idem.ErrClosed)
	}
}

func TestTakeOver(t *testing.T) {
	db, clock := idemtest.Open(t, &pebblestore.Options{Lease: time.Minute})
	s := scope("k1")

	_, err := db.TakeOver(ctx, s)
	assert.ErrorIs(t, err, idem.ErrNotFound)
	_, err = db.TakeOver(ctx, idem.Scope{})
	assert.ErrorIs(t, err, idem.ErrInvalidScope)

	first := claim(t, db, s, fp("a"))
	clock.Advance(20 * time.Second)
	_, err = db.TakeOver(ctx, s)
	ke := keyErr(t, err, idem.ErrInProgress, idem.StateInProgress)
	assert.Equal(t, 40*time.Second, ke.RetryAfter, "the rest of the lease, not the one-second claim hint")

	clock.Advance(40 * time.Second)
	op, err := db.TakeOver(ctx, s)
	require.NoError(t, err, "an overdue claim can be taken over")
	assert.Equal(t, uint32(2), op.Record().Attempts)
	assert.ErrorIs(t, first.Complete(ctx, paid), idem.ErrLeaseLost, "the old holder is locked out")
	require.NoError(t, op.MarkUnknown(ctx))

	for _, to := range []idem.State{idem.StateFailed, idem.StateUnknown} {
		op, err = db.TakeOver(ctx, s)
		require.NoError(t, err, "from %s", to)
		if to == idem.StateFailed {
			require.NoError(t, op.MarkFailed(ctx))
		} else {
			require.NoError(t, op.MarkUnknown(ctx))
		}
	}

	op, err = db.TakeOver(ctx, s)
	require.NoError(t, err)
	require.NoError(t, op.Complete(ctx, paid))
	rec, err := db.Get(ctx, s)
	require.NoError(t, err)
	assert.Equal(t, idem.StateCompleted, rec.State)
	assert.Equal(t, uint32(5), rec.Attempts)
	assert.Equal(t, fp("a"), rec.Fingerprint, "the fingerprint is the first claim's")

	_, err = db.TakeOver(ctx, s)
	assert.ErrorIs(t, err, idem.ErrCompleted)
	after, err := db.Get(ctx, s)
	require.NoError(t, err)
	assert.Equal(t, rec, after, "a refused takeover changes nothing")
	pebblestore.RequireConsistent(t, db)

	// Released by an operator, the key is free again.
	claim(t, db, scope("k2"), fp("b")).MarkUnknown(ctx)
	op, err = db.TakeOver(ctx, scope("k2"))
	require.NoError(t, err)
	require.NoError(t, op.Release(ctx))
	claim(t, db, scope("k2"), fp("c"))
	pebblestore.RequireConsistent(t, db)
}

// TestEventsOnePerTransition drives a record through every transition and
// checks the event log: one line each, the right names, and never the key.
func TestEventsOnePerTransition(t *testing.T) {
	var buf bytes.Buffer
	events := slog.New(slog.NewTextHandler(&buf, nil))
	db, clock := idemtest.Open(t, &pebblestore.Options{Events: events, Lease: time.Minute, TTL: time.Hour,
		Reconcile: func(ctx context.Context, l idem.Lease) error { return l.Complete(ctx, paid) }})
	const secret = "sk-very-secret-key-0001"
	s := idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: secret}

	l := claim(t, db, s, fp("a"))
	_, _, err := db.Claim(ctx, s, fp("a"))
	require.ErrorIs(t, err, idem.ErrInProgress)
	_, _, err = db.Claim(ctx, s, fp("other"))
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	clock.Advance(5 * time.Second)
	require.NoError(t, l.Complete(ctx, paid))
	_, rec, err := db.Claim(ctx, s, fp("a"))
	require.NoError(t, err)
	require.NotNil(t, rec)

	s2 := s
	s2.Key = secret + "-2"
	require.NoError(t, claim(t, db, s2, fp("a")).MarkUnknown(ctx))
	_, _, err = db.Claim(ctx, s2, fp("a"))
	require.ErrorIs(t, err, idem.ErrOutcomePending)
	op, err := db.TakeOver(ctx, s2)
	require.NoError(t, err)
	require.NoError(t, op.Release(ctx))

	s3 := s
	s3.Key = secret + "-3"
	claim(t, db, s3, fp("a"))
	clock.Advance(2 * time.Minute)
	_, err = db.Reconcile(ctx)
	require.NoError(t, err)
	s4 := s
	s4.Key = secret + "-4"
	require.NoError(t, claim(t, db, s4, fp("a")).MarkFailed(ctx))
	clock.Advance(2 * time.Hour)
	_, err = db.Sweep(ctx)
	require.NoError(t, err)

	var names []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		assert.NotContains(t, line, secret, "a raw key reached the event log")
		assert.Contains(t, line, "level=INFO")
		assert.Contains(t, line, "tenant=acme")
		assert.Contains(t, line, `endpoint="POST /v1/payments"`)
		assert.Regexp(t, `key_hash=[0-9a-f]{16} `, line)
		assert.Regexp(t, `fingerprint=[0-9a-f]{12} `, line)
		name := strings.Fields(line[strings.Index(line, "event=")+len("event="):])[0]
		names = append(names, name)
	}
	assert.Equal(t, []string{
		"claimed", "conflict", "mismatch", "completed", "replayed",
		"claimed", "unknown", "pending", "taken_over", "released",
		"claimed", "taken_over", "completed", "reconciled",
		"claimed", "failed",
		"swept", "swept", "swept",
	}, names)
	assert.Contains(t, buf.String(), "event=completed tenant=acme endpoint=\"POST /v1/payments\" key_hash="+idem.KeyHash(secret)+" fingerprint="+fp("a").String()[:12]+" state=completed status=201 latency=5s")
	assert.Contains(t, buf.String(), "state=in_progress attempts=2", "a takeover says which attempt it is")
}

func TestPing(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	require.NoError(t, db.Ping(ctx))
	require.NoError(t, db.Close())
	assert.ErrorIs(t, db.Ping(ctx), idem.ErrClosed)
}

func TestMustExist(t *testing.T) {
	fs := vfs.NewMem()
	_, err := pebblestore.Open("nowhere", pebblefs.With(&pebblestore.Options{MustExist: true}, fs))
	require.ErrorIs(t, err, pebblestore.ErrNoStore)
	require.NoError(t, fs.MkdirAll("empty", 0o755))
	_, err = pebblestore.Open("empty", pebblefs.With(&pebblestore.Options{MustExist: true}, fs))
	require.ErrorIs(t, err, pebblestore.ErrNoStore)
	list, err := fs.List("empty")
	require.NoError(t, err)
	assert.Empty(t, list, "a refused Open writes nothing")

	db, err := pebblestore.Open("made", pebblefs.With(&pebblestore.Options{SweepInterval: -1}, fs))
	require.NoError(t, err)
	require.NoError(t, db.Close())
	db, err = pebblestore.Open("made", pebblefs.With(&pebblestore.Options{SweepInterval: -1, MustExist: true}, fs))
	require.NoError(t, err)
	require.NoError(t, db.Close())
}

// TestCompactReclaimsNow checks that Compact sweeps everything expired,
// reports its progress in order, and leaves a smaller store on disk.
func TestCompactReclaimsNow(t *testing.T) {
	clock := fake.NewClock()
	dir := filepath.Join(t.TempDir(), "db")
	opts := &pebblestore.Options{Now: clock.Now, SweepInterval: -1, CompactBytes: 1 << 40, TTL: time.Hour, Lease: time.Minute}
	db, err := pebblestore.Open(dir, opts)
	require.NoError(t, err)
	defer func() { db.Close() }()
	// Chunked bodies, and enough of them that the log files Pebble keeps
	// for reuse (a few MiB) do not hide what the records take.
	body := make([]byte, 96<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range body {
		body[i] = byte(rng.Uint32()) // incompressible, to take real space
	}
	for i := range 300 {
		body[0] = byte(i)
		l := claim(t, db, scope(fmt.Sprint(i)), fp("a"))
		require.NoError(t, l.Complete(ctx, idem.Response{Status: 200, Body: body}))
	}
	// Pebble deletes the files a compaction made obsolete in the
	// background, and Close waits for that: measure a reopened store.
	reopen := func() idem.Metrics {
		require.NoError(t, db.Close())
		db, err = pebblestore.Open(dir, opts)
		require.NoError(t, err)
		m, err := db.Metrics(context.Background())
		require.NoError(t, err)
		return m
	}
	// Nothing has expired yet: this only moves everything into tables.
	res, err := db.Compact(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, res.Records)
	before := reopen()
	clock.Advance(2 * time.Hour)

	var steps []idem.CompactProgress
	res, err = db.Compact(ctx, func(p idem.CompactProgress) { steps = append(steps, p) })
	require.NoError(t, err)
	assert.Equal(t, 300, res.Records)
	assert.Equal(t, 4, res.Compactions)
	require.NotEmpty(t, steps)
	assert.Equal(t, idem.CompactProgress{Phase: "sweep", Done: 0, Total: 300}, steps[0])
	assert.Equal(t, idem.CompactProgress{Phase: "compact", Done: 4, Total: 4}, steps[len(steps)-1])
	for i := 1; i < len(steps); i++ {
		prev, cur := steps[i-1], steps[i]
		assert.True(t, cur.Phase != prev.Phase || cur.Done > prev.Done, "progress goes forward: %v then %v", prev, cur)
	}
	after := reopen()
	assert.Zero(t, after.Expired)
	t.Logf("disk usage %.0f -> %.0f bytes", figure(t, before, pebblestore.FigureDiskBytes), figure(t, after, pebblestore.FigureDiskBytes))
	assert.Less(t, figure(t, after, pebblestore.FigureDiskBytes), figure(t, before, pebblestore.FigureDiskBytes)/4, "the space of 300 expired records left the disk")
}

func TestCompactOnClosedDB(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	require.NoError(t, db.Close())
	_, err := db.Compact(ctx, nil)
	assert.True(t, errors.Is(err, idem.ErrClosed))
}
