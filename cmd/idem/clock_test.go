package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/pebblestore"
)

// TestClockReset writes a store under a clock an hour ahead, as a device
// whose clock ran ahead would: the store then refuses claims under the
// real clock until idem clock --reset moves its mark back.
func TestClockReset(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	r := runIdem(t, "", "clock", "--data", dir)
	assert.Equal(t, 1, r.code, "a tool never creates a store")

	ahead := time.Now().Add(time.Hour)
	db, err := pebblestore.Open(dir, &pebblestore.Options{Now: func() time.Time { return ahead }, SweepInterval: -1})
	require.NoError(t, err)
	_, _, err = db.Claim(context.Background(), seeded.fresh, idem.Fingerprint{1})
	require.NoError(t, err)
	require.NoError(t, db.Close())

	r = runIdem(t, "", "clock", "--data", dir)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "behind it")
	claimNow := func() error {
		db, err := pebblestore.Open(dir, &pebblestore.Options{SweepInterval: -1, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		defer db.Close()
		_, _, err = db.Claim(context.Background(), seeded.completed, idem.Fingerprint{1})
		return err
	}
	require.ErrorIs(t, claimNow(), idem.ErrClockBehind)

	r = runIdem(t, "", "clock", "--data", dir, "--reset")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "clock mark reset from ")
	r = runIdem(t, "", "clock", "--data", dir)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "past it")
	require.NoError(t, claimNow())

	r = runIdem(t, "", "clock", "--data", dir, "extra")
	assert.Equal(t, 2, r.code)
}
