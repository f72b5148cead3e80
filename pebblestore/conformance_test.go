package pebblestore_test

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/pebblestore"
)

// TestConformance runs the public conformance suite on the embedded
// store, in memory and on the real filesystem, whose syncs and locks the
// in-memory one only imitates, and on the disk under the smallest memory
// budget, whose memtables, logs and key filter are the smallest.
func TestConformance(t *testing.T) {
	for name, fs := range map[string]func(t *testing.T) (vfs.FS, string, int64){
		"mem":        func(t *testing.T) (vfs.FS, string, int64) { return vfs.NewMem(), "db", 0 },
		"disk":       func(t *testing.T) (vfs.FS, string, int64) { return vfs.Default, t.TempDir(), 0 },
		"disk-small": func(t *testing.T) (vfs.FS, string, int64) { return vfs.Default, t.TempDir(), 4 << 20 },
	} {
		t.Run(name, func(t *testing.T) {
			// The small store keeps small bodies too: the suite checks the
			// limit it is given.
			limit := int64(idem.DefaultMaxBodyBytes)
			if name == "disk-small" {
				limit = 1 << 20
			}
			idemtest.TestStore(t, idemtest.Limits{MaxBodyBytes: limit}, func(t *testing.T, now func() time.Time) idem.Store {
				fs, dir, memory := fs(t)
				db, err := pebblestore.Open(dir, pebblefs.With(&pebblestore.Options{Now: now, SweepInterval: -1, Logger: discard(),
					MemoryBytes: memory, MaxBodyBytes: limit}, fs))
				require.NoError(t, err)
				t.Cleanup(func() { _ = db.Close() })
				return db
			})
		})
	}
}
