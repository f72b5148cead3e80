package pebblestore_test

import (
	"bytes"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/pebblestore"
)

// TestFilesAreOwnersOnly: stored responses are readable by the store's
// owner alone, whatever the umask, and a directory others can read is
// reported at open.
func TestFilesAreOwnersOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	var logs bytes.Buffer
	opts := &pebblestore.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	db, err := pebblestore.Open(dir, opts)
	require.NoError(t, err)
	l, _, err := db.Claim(t.Context(), idem.Scope{Endpoint: "POST /v1/payments", Key: "k1"}, idem.Fingerprint{1})
	require.NoError(t, err)
	require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 201, Body: []byte(`{"card":"4242"}`)}))
	require.NoError(t, db.Close())

	st, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o700), st.Mode().Perm())
	files := 0
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		info, err := d.Info()
		require.NoError(t, err)
		if d.IsDir() || info.Size() == 0 { // the empty LOCK file holds nothing
			return nil
		}
		files++
		assert.Equal(t, fs.FileMode(0o600), info.Mode().Perm(), path)
		return nil
	}))
	assert.NotZero(t, files)
	assert.Empty(t, logs.String())

	require.NoError(t, os.Chmod(dir, 0o755))
	db, err = pebblestore.Open(dir, opts)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	assert.Contains(t, logs.String(), "the data directory can be read by other users")
}
