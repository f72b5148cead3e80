package pgstore_test

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

// Two replicas whose clocks differ by the ClockSkew they are told: the one
// running ahead neither ends the other's lease nor expires its record
// before the lease and the TTL have passed on the clock of the replica
// that claimed.
func TestClockSkewMargin(t *testing.T) {
	const (
		skew  = 5 * time.Second
		lease = 30 * time.Second
		ttl   = time.Hour
	)
	clock := idemtest.NewClock()
	ahead := func() time.Time { return clock.Now().Add(skew) }
	dsn := pgtest.DSN(t)
	opts := func(now func() time.Time) *pgstore.Options {
		return &pgstore.Options{Now: now, ClockSkew: skew, Lease: lease, TTL: ttl}
	}
	a, b := open(t, dsn, opts(clock.Now)), open(t, dsn, opts(ahead))

	held, _, err := a.Claim(t.Context(), scope("held"), fp)
	require.NoError(t, err)
	done, _, err := a.Claim(t.Context(), scope("done"), fp)
	require.NoError(t, err)
	require.NoError(t, done.Complete(t.Context(), created))

	// Just before the lease ends on a's clock, b's clock is past it by
	// nearly the skew: b still sees the claim in progress.
	clock.Advance(lease - time.Millisecond)
	_, _, err = b.Claim(t.Context(), scope("held"), fp)
	require.ErrorIs(t, err, idem.ErrInProgress)
	overdue, err := b.Overdue(t.Context(), 10)
	require.NoError(t, err)
	assert.Empty(t, overdue, "b lists a running lease as overdue")
	_, err = b.TakeOver(t.Context(), scope("held"))
	assert.ErrorIs(t, err, idem.ErrInProgress)
	require.NoError(t, held.Extend(t.Context()), "the holder lost its lease early")

	// Past the lease and the margin, for the clock of either, it is over.
	clock.Advance(lease + skew)
	_, _, err = b.Claim(t.Context(), scope("held"), fp)
	require.ErrorIs(t, err, idem.ErrOutcomePending)
	_, _, err = a.Claim(t.Context(), scope("held"), fp)
	require.ErrorIs(t, err, idem.ErrOutcomePending)

	// Just before the TTL ends on a's clock, b still replays the record.
	clock.Advance(ttl - 2*lease - skew)
	_, rec, err := b.Claim(t.Context(), scope("done"), fp)
	require.NoError(t, err)
	require.NotNil(t, rec, "b expired the record before its TTL had passed")
	assert.Equal(t, idem.StateCompleted, rec.State)

	// Past the TTL and the margin, for the clock of either, it has expired.
	clock.Advance(skew + time.Millisecond)
	_, err = a.Get(t.Context(), scope("done"))
	assert.ErrorIs(t, err, idem.ErrNotFound)
}

// A replica whose clock is off from the database server's by more than
// half of ClockSkew says so when it opens, and its metrics show by how
// much; one on the server's own clock does not.
func TestClockOffsetReported(t *testing.T) {
	dsn := pgtest.DSN(t)
	for _, c := range []struct {
		name   string
		behind time.Duration
		warns  bool
	}{{"in step", 0, false}, {"an hour behind", time.Hour, true}} {
		t.Run(c.name, func(t *testing.T) {
			var log bytes.Buffer
			s := open(t, dsn, &pgstore.Options{
				Now:    func() time.Time { return time.Now().Add(-c.behind) },
				Logger: slog.New(slog.NewTextHandler(&log, nil)),
			})
			assert.Equal(t, c.warns, bytes.Contains(log.Bytes(), []byte("ClockSkew")), "log: %s", log.String())
			m, err := s.Metrics(t.Context())
			require.NoError(t, err)
			off, ok := m.Figure("idem_pg_clock_offset_seconds")
			require.True(t, ok)
			assert.InDelta(t, c.behind.Seconds(), off, 0.5)
		})
	}
}
