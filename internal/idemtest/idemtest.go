// Package idemtest opens idem databases for tests, in memory and on the
// fake clock of the public idemtest package, and sends HTTP requests to
// the servers under test.
package idemtest

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/pebblestore"
)

// Open opens a store on a fresh in-memory filesystem with a fake clock
// and no background loop, and closes it when the test ends. opts may be
// nil; its Now and SweepInterval are filled in when unset.
func Open(t testing.TB, opts *pebblestore.Options) (*pebblestore.Store, *idemtest.Clock) {
	t.Helper()
	return OpenFS(t, vfs.NewMem(), opts)
}

// OpenFS is Open on the filesystem fs, for a test that reopens a store or
// crashes it.
func OpenFS(t testing.TB, fs vfs.FS, opts *pebblestore.Options) (*pebblestore.Store, *idemtest.Clock) {
	t.Helper()
	var o pebblestore.Options
	if opts != nil {
		o = *opts
	}
	pebblefs.With(&o, fs)
	clock := idemtest.NewClock()
	if o.Now == nil {
		o.Now = clock.Now
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = -1
	}
	db, err := pebblestore.Open("db", &o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db, clock
}
